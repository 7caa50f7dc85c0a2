"""What an agent of ``agent_study.py`` writes and how one candidate is evaluated (compile, check, time).

The candidate space (:func:`space`): for every kernel of ``krex_lab/kernels/``, its naive and optimised
variants (numba.cuda), parameter mutations of them (block size, tile shape, the depth of a
matmul's shared-memory step, a vector add's chunk) and a few wrong ones on purpose (an
off-by-one bound, a swapped tile index, a block size the reduction tree cannot take, a typo
that does not compile). Where Triton and a GPU are, also Triton versions of vector_add, softmax
and matmul (``agent_triton/``) with their mutations (block, warps, tile depth) and wrong ones.
:func:`write_source` *writes* a candidate as an agent would: the kernel's module with the change
applied, as a new ``.py`` file.

:func:`evaluate` is the evaluation of one written candidate, run in the agent's own child
(``python agent_kernels.py eval``: cold) or on a warm context worker (``krex_lab.submit``):

1. compile: import the file and call the candidate once on the smallest test size (numba.cuda
   JIT-compiles on the first call; the array types are those of the larger sizes, so nothing
   compiles again). A Triton candidate is called on the check size instead: Triton specialises
   on sizes divisible by 16, as the check and timing sizes are and the test size is not. Each
   written file names itself inside its kernel (``# @candidate@``), so Triton's cache, which
   keys on the kernel's source, never holds it: an agent's code is new.
   In numba's CUDA simulator (the fake backend) nothing compiles: the phase
   first burns the drawn ``sim_compile_s`` of CPU time (:func:`burn_cpu`), then makes the same
   import and call.
2. check: ``krex_lab.check`` against the NumPy reference (fresh inputs, NaN-poisoned outputs).
3. time: ``krex_lab.bench`` on device inputs (in the simulator: host-clock timing of the
   simulated kernel, flagged simulated).

The region covers 1-3 (``command``), only 3 (``region``) or nothing (``none``); the record says
when it was requested, granted and released (wall clock), and what the arbiter reported.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# krex_lab (its kernels/), benchmarks/ (common) and agent_triton/ here, for the written candidates too
for _path in (REPO, HERE.parent, HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


@dataclass(frozen=True)
class Candidate:
    kernel: str
    variant: str  # "naive" | "optimised": the function of the module that is the candidate
    change: str = ""  # what the agent changed ("" = the library's code as it is)
    wrong: str = ""  # why the candidate is wrong on purpose ("" = correct)

    @property
    def id(self) -> str:
        return f"{self.kernel}/{self.variant}" + (f"/{self.change}" if self.change else "")

    @property
    def compiler(self) -> str:
        return "triton" if self.variant == "triton" else "numba"

    @property
    def function(self) -> str:
        """The candidate's function in its written module."""
        return "run" if self.compiler == "triton" else self.variant


#: (kernel, variant, change, wrong-on-purpose reason); changes are keys of EDITS
SPACE: list[Candidate] = [
    Candidate("vector_add", "naive"),
    Candidate("vector_add", "naive", "chunk/2"),
    Candidate("vector_add", "optimised"),
    Candidate("vector_add", "optimised", "block/2"),
    Candidate("vector_add", "optimised", "off-by-one", "skips the last element"),
    Candidate("vector_add", "optimised", "typo", "does not compile (undefined name)"),
    Candidate("reduction", "naive"),
    Candidate("reduction", "optimised"),
    Candidate("reduction", "optimised", "block*2"),
    Candidate("reduction", "optimised", "block*3/4", "the tree needs a power-of-two block"),
    Candidate("softmax", "naive"),
    Candidate("softmax", "optimised"),
    Candidate("softmax", "optimised", "block/2"),
    Candidate("softmax", "optimised", "wrong-sum", "divides by a partial sum"),
    Candidate("transpose", "naive"),
    Candidate("transpose", "optimised"),
    Candidate("transpose", "optimised", "rows/2"),
    Candidate("transpose", "optimised", "tile/2"),
    Candidate("transpose", "optimised", "swapped-tile", "reads the tile untransposed"),
    Candidate("matmul", "naive"),
    Candidate("matmul", "optimised"),
    Candidate("matmul", "optimised", "bk*2"),
    Candidate("matmul", "optimised", "tm/2"),
    Candidate("matmul", "optimised", "last-k-step", "drops the last k step"),
    # Triton (agent_triton/), where Triton and a GPU are
    Candidate("vector_add", "triton"),
    Candidate("vector_add", "triton", "BLOCK*2"),
    Candidate("vector_add", "triton", "mask-n-1", "leaves the last element unwritten"),
    Candidate("softmax", "triton"),
    Candidate("softmax", "triton", "warps*2"),
    Candidate("softmax", "triton", "max-not-sum", "divides by the row's largest term"),
    Candidate("matmul", "triton"),
    Candidate("matmul", "triton", "bk*2"),
    Candidate("matmul", "triton", "bm/2"),
    Candidate("matmul", "triton", "last-k-step", "drops the last k step"),
]
COMPILERS = ("numba", "triton")

_AFTER_IMPORT = "__after_spec_import__"
#: change -> (regex, replacement) applied to the kernel module's source (each must match)
EDITS: dict[str, list[tuple[str, str]]] = {
    "chunk/2": [(r"^CHUNK = 8$", "CHUNK = 4")],
    "block/2": [(_AFTER_IMPORT, "THREADS = THREADS // 2")],
    "block*2": [(_AFTER_IMPORT, "THREADS = THREADS * 2")],
    "block*3/4": [(_AFTER_IMPORT, "THREADS = THREADS * 3 // 4")],
    "off-by-one": [(r"while i < c\.size:", "while i < c.size - 1:")],
    "typo": [(r"c\[i\] = a\[i\] \+ b\[i\]\n        i \+= stride", "c[i] = a[i] + bb[i]\n        i += stride")],
    "wrong-sum": [(r"inv = float32\(1\.0\) / total\[0\]", "inv = float32(1.0) / total[1]")],
    "rows/2": [(r"^(ROWS = )(.*?)(  #.*)?$", r"\1(\2) // 2\3")],
    "tile/2": [(r"^(TILE = )(.*)$", r"\1(\2) // 2")],
    "swapped-tile": [(r"y\[i, j\] = tile\[tx, k\]", "y[i, j] = tile[k, tx]")],
    "bk*2": [(r"^(BK = )(.*?)(  #.*)?$", r"\1(\2) * 2\3")],
    "tm/2": [(r"^(TM = )(.*?)(  #.*)?$", r"\1(\2) // 2\3")],
    "last-k-step": [(r"range\(0, kdim, BK\)", "range(0, kdim - BK, BK)")],
    "BLOCK*2": [(r"^BLOCK = (\d+)$", r"BLOCK = \1 * 2")],
    "warps*2": [(r"^WARPS = (\d+)$", r"WARPS = \1 * 2")],
    "bm/2": [(r"^BM = (\d+)$", r"BM = \1 // 2")],
    "mask-n-1": [(r"mask = offs < n$", "mask = offs < n - 1")],
    "max-not-sum": [(r"total = tl\.sum\(e, axis=0\)", "total = tl.max(e, axis=0)")],
}
#: where a Triton kernel's body names the written file (Triton's cache keys on the kernel's source)
_CANDIDATE_MARK = "# @candidate@"


def space(kernels: list[str] | None = None, compilers: tuple[str, ...] = ("numba",)) -> list[Candidate]:
    return [c for c in SPACE if (kernels is None or c.kernel in kernels) and c.compiler in compilers]


def triton_usable() -> str:
    """Why Triton candidates cannot run in this Python ("" when they can: Triton and torch are
    installed; whether a GPU is there is the backend's to say)."""
    missing = [m for m in ("triton", "torch") if importlib.util.find_spec(m) is None]
    return f"{' and '.join(missing)} not installed" if missing else ""


def source(c: Candidate, stem: str = "") -> str:
    """The candidate's module (``krex_lab/kernels/<kernel>.py``, or ``agent_triton/<kernel>.py`` for a Triton
    one) with the change applied; ``stem``, the written file's name, marks a Triton kernel's body."""
    if c.compiler == "triton":
        text = (HERE / "agent_triton" / f"{c.kernel}.py").read_text()
        if _CANDIDATE_MARK not in text:
            raise ValueError(f"agent_triton/{c.kernel}.py has no {_CANDIDATE_MARK!r} line")
        text = text.replace(_CANDIDATE_MARK, f"# candidate {stem or c.id}")
    else:
        text = (REPO / "krex_lab" / "kernels" / f"{c.kernel}.py").read_text()
        text = text.replace("from .spec import", "from krex_lab.kernels.spec import")
    for pattern, repl in EDITS.get(c.change, []):
        if pattern == _AFTER_IMPORT:
            text, n = re.subn(
                r"^(from krex_lab\.kernels\.spec import .*)$", lambda m, r=repl: m.group(1) + "\n" + r, text, flags=re.M
            )
        else:
            text, n = re.subn(pattern, repl, text, count=1, flags=re.M)
        if n != 1:
            raise ValueError(f"{c.id}: the edit {pattern!r} does not apply to its module")
    return f"# written by an agent of benchmarks/agent/agent_study.py: {c.id}\n" + text


def write_source(c: Candidate, directory: Path, stem: str) -> Path:
    path = directory / f"{stem}.py"
    path.write_text(source(c, stem))
    return path


def size_arg(spec: Any, size: str) -> Any:
    """``test0`` / ``test1``: the spec's test sizes (for the simulator); otherwise a preset name."""
    if size.startswith("test"):
        return spec.test_sizes[int(size[4:])]
    return size


class Held:
    """``krex_lab.exclusive`` with wall-clock stamps: requested, granted (after the grant came back),
    released (just before the release is sent). [granted, released] lies inside the arbiter's own
    interval, so two of them overlapping on one GPU means two holders at once."""

    def __init__(self, gpu: int, max_hold: float, freeze: bool = True) -> None:
        import krex_lab

        self.region = krex_lab.exclusive(gpu=gpu, max_hold=max_hold, freeze=freeze)
        self.gpu = gpu
        self.info: dict[str, Any] = {}

    def __enter__(self) -> Held:
        requested = time.time()
        self.region.__enter__()
        self.info = {"gpu": self.gpu, "requested": requested, "granted": time.time(), "id": self.region.id}
        return self

    def __exit__(self, *exc: Any) -> None:
        self.info["released"] = time.time()
        try:
            self.region.__exit__(*exc)
        finally:
            self.info.update(
                wait_s=self.info["granted"] - self.info["requested"],
                hold_s=self.info["released"] - self.info["granted"],
                **_report_fields(dict(self.region.report)),
            )


def region_info(gpu: int, rep: dict[str, Any]) -> dict[str, Any]:
    """:class:`Held`'s record from a region report as the arbiter closed it (its own wall-clock
    times: requested, granted and released, the release's undo included)."""
    granted, released = float(rep.get("granted_at") or 0.0), float(rep.get("released_at") or 0.0)
    requested = float(rep.get("requested_at") or granted)
    return {
        "gpu": gpu,
        "id": rep.get("region"),
        "requested": requested,
        "granted": granted,
        "released": released,
        "wait_s": granted - requested,
        "hold_s": released - granted,
        **_report_fields(rep),
    }


#: a region report's step times (``<step>_s``) kept in an evaluation's record, as ``steps``
STEPS = ("drain", "drain_list", "drain_lock", "freeze", "isolate", "undo", "unisolate", "thaw", "unlock")


def _report_fields(rep: dict[str, Any]) -> dict[str, Any]:
    """What a record keeps of a region report: the arbiter's acquire and queue times, how many
    processes were frozen and locked, whether it was degraded or simulated, and its step times
    (where a region's acquire and release went: absent steps did not run)."""
    return {
        "acquire_s": float(rep.get("acquire_s") or 0.0),
        "arbiter_wait_s": float(rep.get("wait_s") or 0.0),
        "frozen": len(rep.get("frozen") or []),
        "locked": len(rep.get("locked") or []),
        "degraded": bool(rep.get("degraded")),
        "simulated": bool(rep.get("simulated")),
        "steps": {k: float(rep[f"{k}_s"]) for k in STEPS if isinstance(rep.get(f"{k}_s"), (int, float))},
    }


def _load(path: str) -> Any:
    from common import load_file

    return load_file(path, "agent_candidate_" + re.sub(r"\W", "_", Path(path).stem))


def evaluate(job: dict[str, Any]) -> dict[str, Any]:
    """Compile, check and time one written candidate; a record (never raises for the candidate's faults).

    ``job``: candidate (a :class:`Candidate` as a dict), path (its source), mode, gpu, check_size,
    time_size, bench (options of ``krex_lab.bench``), sim_compile_s (the simulator's compile
    phase), outer (a region this process already belongs to: ``command`` mode, cold), max_hold.
    """
    import krex_lab

    c = Candidate(**job["candidate"])
    mode, gpu = job["mode"], int(job["gpu"])
    rec: dict[str, Any] = {"status": "ok", "pid": os.getpid(), "eval_started": time.time(), "region": None}
    freeze = bool(job.get("freeze", True))
    held = Held(gpu, job.get("max_hold", 60.0), freeze) if mode == "command" and not job.get("outer") else None
    try:
        with held if held is not None else contextlib.nullcontext():
            _phases(job, c, mode, gpu, rec, krex_lab)
    except Exception as exc:  # a KREX failure, not the candidate's: said so
        rec.update(status="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(limit=4))
    if held is not None:
        rec["region"] = held.info
    rec["eval_ended"] = time.time()
    return rec


def burn_cpu(seconds: float) -> None:
    """A simulated compile: busy until this process has used ``seconds`` of CPU time. A compile is
    CPU-bound, so under load (or frozen) it takes longer in wall time, as a real one does."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        sum(range(2000))


def _phases(job: dict[str, Any], c: Candidate, mode: str, gpu: int, rec: dict[str, Any], krex_lab: Any) -> None:
    import numpy as np

    from krex_lab import kernels
    from krex_lab.devsync import numba_free_pending
    from krex_lab.kernels.spec import SIMULATOR, cuda

    spec = kernels.get(c.kernel)
    rec["simulated"] = SIMULATOR
    rec["compiler"] = c.compiler
    t0 = time.perf_counter()
    try:
        if SIMULATOR:
            burn_cpu(float(job.get("sim_compile_s") or 0.0))  # the simulated compile phase
        fn = getattr(_load(job["path"]), c.function)
        ins, outs = spec.device_inputs(
            size_arg(spec, job["check_size"]) if c.compiler == "triton" else spec.test_sizes[-1]
        )
        fn(*ins, *outs)  # numba.cuda and Triton compile on the first call
        cuda.synchronize()
        del ins, outs
    except Exception as exc:
        # The tail of the traceback tells a candidate's own error from a failure of the worker it ran on.
        rec.update(
            status="compile_error",
            error=f"{type(exc).__name__}: {exc}"[:300],
            traceback=traceback.format_exc()[-1500:],
        )
        return
    finally:
        rec["compile_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        make = spec.inputs_maker(size_arg(spec, job["check_size"]))
        krex_lab.check(fn, spec.reference, make, rtol=spec.rtol, atol=spec.atol)
    except AssertionError as exc:  # CheckFailed
        rec.update(status="wrong", error=str(exc).splitlines()[0][:300])
        return
    except Exception as exc:
        rec.update(status="wrong", error=f"{type(exc).__name__}: {exc}"[:300])
        return
    finally:
        rec["check_s"] = time.perf_counter() - t0
    ins, outs = spec.device_inputs(size_arg(spec, job["time_size"]))
    if c.compiler == "triton":  # torch views (no copy): bench then times on torch's stream, where Triton launches
        import torch

        ins, outs = (tuple(torch.as_tensor(x, device="cuda") for x in xs) for xs in (ins, outs))
    t0 = time.perf_counter()
    opts = dict(job.get("bench") or {})
    if mode == "region":
        # bench's own region: the warm-up shares the GPU, only the sampling holds it
        freeze = bool(job.get("freeze", True))
        m = krex_lab.bench(fn, *ins, *outs, gpu=gpu, max_hold=job.get("max_hold", 60.0), freeze=freeze, **opts)
        rec["region"] = region_info(gpu, m.region or {})
        rec["phases"] = m.phases
    else:
        m = krex_lab.bench(fn, *ins, *outs, gpu=gpu, exclusive=mode == "command", **opts)
    rec["time_s"] = time.perf_counter() - t0
    rec.update(
        median_ms=m.median,
        p95_ms=m.p95,
        rel_stdev=m.rel_stdev,
        samples=len(m.samples),
        bench_simulated=bool(m.simulated),
        converged=m.stop_reason in ("noise", "stable"),
        sm_mhz=(m.clocks or {}).get("sm_mhz_median"),  # NVML's SM clock over the sampling, where read
    )
    del ins, outs
    with contextlib.suppress(Exception):
        numba_free_pending(cuda.current_context())
    _ = np  # numpy is imported by the kernels anyway


def main() -> None:
    """``python agent_kernels.py eval`` with the job as JSON on stdin: a cold evaluation."""
    import krex_lab

    if sys.argv[1:] != ["eval"]:
        raise SystemExit("usage: python agent_kernels.py eval < JOB.json")
    job = json.loads(sys.stdin.read())
    krex_lab.attach(gpu=int(job["gpu"]), name="eval")  # KREX_REGION (command mode): part of it
    print("AGENT-RESULT " + json.dumps(evaluate(job)), flush=True)


def candidate_dict(c: Candidate) -> dict[str, Any]:
    return asdict(c)


if __name__ == "__main__":
    main()
