"""The red-team corpus in company: every cheat that forges speed, its honest twin and (with
``--kernelbench DIR``) KernelBench's own adversarial kernels, all in ONE batch of ``--jobs``
concurrent evaluations, beside ``--hogs`` foreign GPU processes holding ``--hog-gib`` GiB each
and looping matmuls (benchmarks/eval/foreign.py; on a GPU only). A cheat is forged when it is
``correct`` at a time its twin of the same batch cannot explain (``tests/evaluate/redteam/
harness.py``'s rule); a KernelBench
kernel when it is ``correct`` above KernelBench's own speedup threshold.

    python benchmarks/eval/redteam_batch.py --jobs 16 --hogs 3 --hog-gib 20 --kernelbench .kb

Prints one line per cheat and writes ``redteam_batch-<host>-<date>.json`` (every evaluation's
verdict, runtime, speedup, flags, region reports' degraded count and the calibrated round trip).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import REPO, machine, nvidia_smi, write_result
from foreign import foreign_processes

sys.path.insert(0, str(REPO))

from redteam import CPU_LIMITS, GPU_LIMITS, KB_SPEEDUP, flags, kernelbench_cases, start_pool

from krex_lab.evaluate.batch import BatchRecord, Pair, run_batch
from krex_lab.evaluate.options import EvaluateOptions
from tests.evaluate.redteam import CHEATS, GPU_CHEATS, PROBLEMS, Cheat
from tests.evaluate.redteam.harness import forged_speed


def pairs_for(corpus: list[Cheat], work: Path, kb: Path | None) -> tuple[list[Pair], dict[int, tuple[str, str]]]:
    """The batch's pairs, and for each index (what it is, its name)."""
    pairs: list[Pair] = []
    role: dict[int, tuple[str, str]] = {}
    for cheat in corpus:
        twin = work / f"{cheat.name}__twin.py"
        twin.write_text(cheat.twin())
        ref = str(PROBLEMS / cheat.problem / "reference.py")
        for what, path in (("cheat", cheat.path), ("twin", twin)):
            role[len(pairs)] = (what, cheat.name)
            pairs.append(Pair(index=len(pairs), line=0, reference=ref, candidate=str(path), id=f"{cheat.name}:{what}"))
    if kb is not None:
        for ref_path, kernel in kernelbench_cases(kb):
            role[len(pairs)] = ("kernelbench", kernel.name)
            pairs.append(Pair(index=len(pairs), line=0, reference=str(ref_path), candidate=str(kernel), id=kernel.name))
    return pairs, role


def degraded(rec: BatchRecord) -> int:
    return sum(1 for part in rec.regions if part.region is not None and part.region.degraded)


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=16, help="evaluations at once")
    p.add_argument("--hogs", type=int, default=3, help="foreign GPU processes beside the batch (GPU only)")
    p.add_argument("--hog-gib", type=float, default=20.0, help="GiB of device memory each hog holds")
    p.add_argument("--kernelbench", type=Path, help="a checkout of ScalingIntelligence/KernelBench (GPU only)")
    p.add_argument("--cpu", action="store_true", help="the CPU corpus only, even where a GPU answers")
    args = p.parse_args(argv)
    gpu = bool(nvidia_smi("name")) and not args.cpu
    # the speed cheats alone: what a batch can show (limit/next/cache checks need evaluations in order)
    corpus = [c for c in CHEATS + (GPU_CHEATS if gpu else []) if "speed" in c.checks and not c.lasting]
    work = Path(tempfile.mkdtemp(prefix="krex-redteam-batch-"))
    pairs, role = pairs_for(corpus, work, args.kernelbench.expanduser() if (gpu and args.kernelbench) else None)
    arbiter, pool = start_pool(gpu, work)
    records: dict[int, BatchRecord] = {}
    t0 = time.perf_counter()
    try:
        hogs = (
            foreign_processes(args.hogs, args.hog_gib, backend="nvidia", busy=True)
            if gpu and args.hogs
            else contextlib.nullcontext([])
        )
        with hogs:
            run_batch(
                pairs,
                jobs=args.jobs,
                defaults=EvaluateOptions.of(
                    {"timeouts": GPU_LIMITS if gpu else CPU_LIMITS, **({"gpu": 0} if gpu else {})}
                ),
                pool=pool.client,
                emit=lambda rec: records.__setitem__(rec.index, rec),
            )
    finally:
        pool.stop()
        arbiter.send_signal(signal.SIGTERM)
        arbiter.wait(30)
    wall = time.perf_counter() - t0
    by_name: dict[str, dict[str, BatchRecord]] = {}
    for i, rec in records.items():
        what, name = role[i]
        by_name.setdefault(name, {})[what] = rec
    rows: list[dict[str, Any]] = []
    forged = 0
    print(f"{'candidate':36} {'verdict':14} {'runtime us':>11} {'twin us':>9} {'speedup':>8}  forged?")
    for name, got in by_name.items():
        ev = got.get("cheat") or got.get("kernelbench")
        assert ev is not None
        twin = got.get("twin")
        if twin is not None:
            why = forged_speed(ev, twin) if twin.verdict == "correct" else None
            twin_note = None if twin.verdict == "correct" else f"the twin was not correct: {twin.summary}"
        else:
            why = (
                f"correct at a {ev.speedup}x speedup"
                if ev.verdict == "correct" and (ev.speedup or 0) > KB_SPEEDUP
                else None
            )
            twin_note = None
        forged += why is not None
        rows.append(
            {
                "candidate": name,
                "kind": "kernelbench" if twin is None else "cheat",
                "forged": why,
                "twin_problem": twin_note,
                "eval": {**flags(ev), "degraded_parts": degraded(ev), "metadata": ev.metadata},
                "twin": None if twin is None else {**flags(twin), "degraded_parts": degraded(twin)},
            }
        )
        twin_us = f"{twin.runtime:9.2f}" if twin is not None else f"{'-':>9}"
        print(
            f"{name:36} {ev.verdict:14} {ev.runtime:11.2f} {twin_us} {ev.speedup or 0:8.2f}  "
            f"{'FORGED: ' + why if why else 'stopped'}{'  (' + twin_note + ')' if twin_note else ''}"
        )
    result = {
        "machine": machine(),
        "gpu": gpu,
        "jobs": args.jobs,
        "hogs": {"count": args.hogs if gpu else 0, "gib": args.hog_gib},
        "pairs": len(pairs),
        "wall_s": round(wall, 2),
        "forged": forged,
        "judged": len(rows),
        "twins_not_correct": sum(1 for r in rows if r["twin_problem"]),
        "degraded_parts": sum(r["eval"]["degraded_parts"] + (r["twin"] or {}).get("degraded_parts", 0) for r in rows),
        "rows": rows,
    }
    print(
        f"forged: {forged} of {len(rows)}; twins not correct: {result['twins_not_correct']}; "
        f"degraded timed parts: {result['degraded_parts']}; wall {wall:.1f} s"
    )
    return write_result(f"redteam_batch-{'gpu' if gpu else 'cpu'}-{socket.gethostname()}", result)


if __name__ == "__main__":
    main()
