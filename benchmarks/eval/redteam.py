"""The red-team corpus (tests/evaluate/redteam/) against the evaluator, on whatever this machine has:
every CPU cheat, and on an NVIDIA GPU the GPU-only ones too; with ``--kernelbench DIR`` (a
checkout of ScalingIntelligence/KernelBench) also KernelBench's own adversarial kernels
(``*/unit_tests/test_kernels/*.py``) against the problem their tests use
(``level1/1_Square_matrix_multiplication_.py``), on a GPU.

Prints one line per cheat (its verdict, runtime and speedup, its honest twin's, and what was
forged) and writes ``benchmarks/out/redteam-<machine>-<date>.json`` with every evaluation's
verdict, runtime, speedup and flags, and the count of forged ``correct``s.

    python benchmarks/eval/redteam.py                      # CPU (fake backend), or the GPU when one answers
    python benchmarks/eval/redteam.py --only cache_by_id   # some cheats (by name, comma-separated)
    python benchmarks/eval/redteam.py --kernelbench ~/KernelBench
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import REPO, machine, nvidia_smi, private_arbiter, write_result

sys.path.insert(0, str(REPO))

from krex_lab.evaluate import Evaluation, evaluate
from tests.evaluate.redteam import CHEATS, GPU_CHEATS, Cheat
from tests.evaluate.redteam.harness import Baselines, Record, clean_up, judge_cheat, make_judge
from tests.support.pool import PoolProc

CPU_LIMITS = {"load": 120.0, "check": 20.0, "time": 30.0}
GPU_LIMITS = {"load": 600.0, "check": 60.0, "time": 120.0}
#: KernelBench's own threshold for a speedup from a non-default stream (test_eval_adversarial.py)
KB_SPEEDUP = 1.5
#: metadata keys worth a flag beside the rejections
NOTABLE = ("timing_disagreement", "timing_bound", "static_flags", "output_limit", "timeout")


def flags(ev: Evaluation) -> dict[str, Any]:
    meta = ev.metadata
    return {
        "verdict": ev.verdict,
        "runtime_us": ev.runtime,
        "ref_runtime_us": ev.ref_runtime,
        "speedup": ev.speedup,
        "timing_method": ev.timing_method,
        "flags": sorted(
            {
                *meta.get("rejected", {}),
                *(k for k in ("timing_disagreement", "timing_bound", "static_flags") if k in meta),
            }
        ),
        "summary": ev.summary,
        "warnings": ev.warnings,
    }


def record(rec: Record) -> dict[str, Any]:
    return {
        "cheat": rec.cheat.name,
        "problem": rec.cheat.problem,
        "class": rec.cheat.kind,
        "defence": rec.cheat.defence,
        "checks": list(rec.cheat.checks),
        "forged": rec.found,
        "cheat_eval": flags(rec.ev),
        "twin_eval": flags(rec.twin),
        "later": [{"candidate": name, **flags(ev)} for name, ev in rec.later],
    }


def start_pool(gpu: bool, work: Path) -> tuple[Any, PoolProc]:
    arbiter, env = private_arbiter("krex-redteam-", "--backend", "nvidia" if gpu else "fake")
    env["KREX_EVAL_CACHE"] = str(work / "cache")
    os.environ["KREX_EVAL_CACHE"] = env["KREX_EVAL_CACHE"]
    runtime = Path(env["KREX_RUNTIME_DIR"])
    pool = PoolProc(
        env,
        f"ipc://{runtime / 'pool.sock'}",
        "--Pool.preload=torch",
        "--workers-per-gpu=2",
        "--spares=1",
        "--Pool.interrupt_grace=2.0",
        *(["--Pool.gpus=0"] if gpu else []),
        log=runtime / "pool.log",
    )
    os.environ.update({k: env[k] for k in ("KREX_RUNTIME_DIR", "KREX_ENDPOINT")})
    pool.start(180)
    return arbiter, pool


def kernelbench_cases(root: Path) -> list[tuple[Path, Path]]:
    """(reference, adversarial kernel) pairs of a KernelBench checkout, as its own tests pair them."""
    refs = sorted(root.rglob("level1/1_Square_matrix_multiplication_.py"))
    kernels = sorted(p for p in root.rglob("unit_tests/test_kernels/*.py") if p.name != "__init__.py")
    if not refs or not kernels:
        raise SystemExit(f"{root}: no level1/1_Square_matrix_multiplication_.py or unit_tests/test_kernels/*.py")
    return [(refs[0], k) for k in kernels]


def run_kernelbench(root: Path, pool: PoolProc) -> list[dict[str, Any]]:
    out = []
    for ref, kernel in kernelbench_cases(root):
        ev = evaluate(ref, kernel, pool=pool.client, gpu=0, timeouts=GPU_LIMITS, retime_reference=True)
        forged = ev.verdict == "correct" and (ev.speedup or 0) > KB_SPEEDUP
        out.append({"kernel": str(kernel.relative_to(root)), "reference": str(ref.relative_to(root)), **flags(ev)})
        out[-1]["forged"] = [f"correct at a {ev.speedup}x speedup"] if forged else []
        print(f"{kernel.name:34} {ev.verdict:14} speedup {ev.speedup}  {'FORGED' if forged else 'stopped'}")
    return out


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernelbench", type=Path, help="a checkout of ScalingIntelligence/KernelBench")
    p.add_argument("--only", default="", help="cheats to run, by name (comma-separated)")
    p.add_argument("--cpu", action="store_true", help="the CPU corpus only, even where a GPU answers")
    args = p.parse_args(argv)
    gpu = bool(nvidia_smi("name")) and not args.cpu
    corpus: list[Cheat] = CHEATS + (GPU_CHEATS if gpu else [])
    if args.only:
        names = set(args.only.split(","))
        corpus = [c for c in corpus if c.name in names]
    corpus = [c for c in corpus if not c.lasting] + [c for c in corpus if c.lasting]
    limits = GPU_LIMITS if gpu else CPU_LIMITS
    work = Path(tempfile.mkdtemp(prefix="krex-redteam-work-"))
    arbiter, pool = start_pool(gpu, work)
    results: dict[str, Any] = {"machine": machine(), "gpu": gpu, "cheats": [], "kernelbench": []}
    try:
        judge = make_judge(pool, limits, **({"gpu": 0} if gpu else {"perf_trials": 30}))
        baselines = Baselines()
        print(f"{'cheat':34} {'class':34} {'verdict':14} {'runtime us':>11} {'twin us':>9} {'speedup':>9}  forged?")
        for cheat in corpus:
            try:
                rec = judge_cheat(cheat, judge, pool, baselines, limits)
            except AssertionError as exc:  # the twin or a baseline failed: the corpus is wrong, not the evaluator
                results["cheats"].append({"cheat": cheat.name, "error": str(exc)})
                print(f"{cheat.name:34} ERROR {exc}")
                continue
            finally:
                clean_up(pool.env.get("PYTHONPATH", ""))
            results["cheats"].append(record(rec))
            ev = rec.ev
            print(
                f"{cheat.name:34} {cheat.kind[:34]:34} {ev.verdict:14} {ev.runtime:11.2f} {rec.twin.runtime:9.2f}"
                f" {ev.speedup or 0:9.2f}  {'FORGED: ' + '; '.join(rec.found) if rec.found else 'stopped'}"
            )
        if args.kernelbench:
            if not gpu:
                raise SystemExit("KernelBench's adversarial kernels are CUDA: they need an NVIDIA GPU")
            results["kernelbench"] = run_kernelbench(args.kernelbench.expanduser(), pool)
    finally:
        pool.stop()
        arbiter.send_signal(signal.SIGTERM)
        arbiter.wait(30)
    done = [c for c in results["cheats"] if "forged" in c]
    results["forged_correct"] = sum(1 for c in done if c["forged"]) + sum(
        1 for k in results["kernelbench"] if k["forged"]
    )
    results["judged"] = len(done) + len(results["kernelbench"])
    print(f"forged: {results['forged_correct']} of {results['judged']}")
    host = "gpu" if gpu else "cpu"
    return write_result(f"redteam-{host}-{socket.gethostname()}", results)


if __name__ == "__main__":
    main()
