"""The agent study's KernelBench mode (``agent_study.py --kernelbench``): agents write candidates of
the KernelBench-format problems of ``benchmarks/eval_problems/`` and submit each through
``krex_lab.evaluate`` (compile and check on a warm context worker, the timing in a region).

The candidate space (:func:`space`): every candidate of the kinds this machine runs (``cuda``
through ``load_inline`` where nvcc is, ``triton`` where Triton and a GPU are, ``numba`` and
``torch``; on the fake backend ``torch`` and ``numba``, the latter in numba's CUDA simulator), each
as written and in two wrong versions: ``off`` (scales its output by 1.001: outside the 1e-4
tolerance) and ``typo`` (a syntax error: it does not compile). Every written file starts with a
line naming it, so its hash is new and it builds in a build directory of its own, as an agent's new
code does (a CUDA candidate compiles again each time).

Modes: ``region`` (the evaluator's own regions around the timing) and ``none`` (``exclusive=False``).
There is no ``command`` mode: the evaluation runs on a pool worker, whose region a region held by
the agent around it would wait for. No reference pass either: each result carries its reference's
time (``ref_runtime``, timed once per problem and cached), and its speedup.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eval"))  # eval_set, of the evaluator's family
import agent_kernels as ak
import eval_set

WRONG = {
    "off": "scales its output by 1.001 (outside a 1e-4 tolerance)",
    "typo": "does not compile (a syntax error)",
}
_EDITS = {
    "off": (
        "\n\n# the agent's slip: every output scaled\n_forward = ModelNew.forward\n\n\n"
        "def _scaled(self, *args):\n    return _forward(self, *args) * 1.001\n\n\nModelNew.forward = _scaled\n"
    ),
    "typo": "\n\ndef _helper(:  # the agent's typo\n    pass\n",
}
#: the study's statuses ("ok", "wrong", "compile_error"; anything else is said by its verdict)
STATUS = {"correct": "ok", "incorrect": "wrong", "rejected": "wrong", "compile_error": "compile_error"}
MODES = ("region", "none")


def kinds(backend: str) -> tuple[tuple[str, ...], list[str]]:
    """The candidate kinds this machine runs, and why the others are left out."""
    if backend == "fake":
        return ("torch", "numba"), ["cuda and triton: the fake backend has no GPU"]
    out, why = ["torch"], []
    if importlib.util.find_spec("numba") is not None:
        out.append("numba")
    else:
        why.append("numba: not installed")
    if ak.triton_usable():
        why.append(f"triton: {ak.triton_usable()}")
    else:
        out.append("triton")
    if shutil.which("nvcc"):
        out.append("cuda")
    else:
        why.append("cuda: no nvcc on PATH")
    return tuple(out), why


def space(selected: tuple[str, ...], problems: list[str] | None = None) -> list[ak.Candidate]:
    out = []
    for pair in eval_set.pairs(selected, problems):
        variant = f"kb-{pair.kind}"
        out.append(ak.Candidate(pair.problem, variant))
        out += [ak.Candidate(pair.problem, variant, change, why) for change, why in WRONG.items()]
    return out


def pair_of(c: ak.Candidate) -> eval_set.Pair:
    return eval_set.Pair(c.kernel, c.variant.removeprefix("kb-"))


def write_source(c: ak.Candidate, directory: Path, stem: str) -> Path:
    text = (
        f"# written by an agent of benchmarks/agent/agent_study.py: {c.id} ({stem})\n"
        + pair_of(c).candidate.read_text()
    )
    path = directory / f"{stem}.py"
    path.write_text(text + _EDITS.get(c.change, ""))
    return path


def evaluate(job: dict[str, Any]) -> dict[str, Any]:
    """``krex_lab.evaluate`` of one written candidate, as a record of the study (``median_ms`` is
    KernelBench's runtime, a mean, in ms; ``region`` the candidate's timed part's region)."""
    import krex_lab

    c = ak.Candidate(**job["candidate"])
    rec: dict[str, Any] = {"status": "error", "pid": os.getpid(), "eval_started": time.time(), "region": None}
    try:
        ev = krex_lab.evaluate(
            job["reference"],
            job["path"],
            gpu=int(job["gpu"]),
            exclusive=job["mode"] != "none",
            trials=job.get("trials"),
            perf_trials=job.get("perf_trials"),
        )
    except Exception as exc:  # a bad call or no pool: KREX's failure, not the candidate's
        rec["error"] = f"{type(exc).__name__}: {exc}"[:400]
        rec["eval_ended"] = time.time()
        return rec
    rec.update(
        status=STATUS.get(ev.verdict, ev.verdict),
        verdict=ev.verdict,
        compiler=pair_of(c).kind,
        simulated=not ev.gpu_timed,
        compile_s=ev.phases.get("load"),
        check_s=ev.phases.get("check"),
        time_s=ev.phases.get("time"),
        ref_runtime_us=ev.ref_runtime,
        speedup=ev.speedup,
        timing_method=ev.timing_method,
    )
    if ev.verdict != "correct":
        rec["error"] = ev.summary[:300]
    if ev.runtime > 0:
        rec["median_ms"] = ev.runtime / 1000.0
    parts = [p for p in ev.regions if p.program == "candidate" and p.region]
    if parts:
        rec["region"] = ak.region_info(int(job["gpu"]), parts[0].region or {})
    rec["eval_ended"] = time.time()
    return rec


def setup(args: Any, problems: list[str]) -> tuple[list[ak.Candidate], tuple[str, ...]]:
    """The candidates of ``--kernelbench`` and their kinds; refuses what the mode cannot do."""
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in modes) or args.launch != "warm":
        raise SystemExit(
            f"agent_study --kernelbench: --modes {','.join(MODES)} and --launch warm only (the evaluation runs "
            f"on a pool worker, which a region held around it would wait for), not --modes {args.modes} "
            f"--launch {args.launch}"
        )
    selected, left_out = kinds(args.backend)
    for why in left_out:
        print(f"agent_study: no {why}", flush=True)
    try:
        return space(selected, problems), selected
    except ValueError as exc:
        raise SystemExit(f"agent_study --kernelbench: {exc}") from None


def world_env(backend: str) -> dict[str, str]:
    """What the pool's workers need: CPU-sized problems and one thread each on the fake backend."""
    return {eval_set.SIZE_ENV: "small", "OMP_NUM_THREADS": "1"} if backend == "fake" else {}


def trials(backend: str) -> dict[str, int]:
    """Correctness trials and timed calls: KernelBench's 5 and 100; a few on the fake backend, whose
    numba candidates run in the simulator (a Python loop per thread)."""
    return {"trials": 2, "perf_trials": 5} if backend == "fake" else {"trials": 5, "perf_trials": 100}
