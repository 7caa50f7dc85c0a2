"""What ``krex_lab.evaluate`` adds over the work itself, on a warm worker.

Starts its own arbiter and pool (private runtime dir; the pool preloads torch), evaluates one
KernelBench pair (default: the tests' elementwise problem and its correct candidate) a few times
to warm up, then ``--runs`` times in this process. Per evaluation:

* work: the phases as the worker timed them (load + check + time: compiling, the correctness
  trials, the timing loops and their region);
* overhead: the call's wall time minus that work: reading and hashing the programs, the pool
  round trip, pickling, the worker's own set-up around the phases, the result's assembly.

* defences: what each of the judge's defences cost the evaluation, from its verdict's metadata
  (:data:`DEFENCES`): a clean spare, the sandbox's file part, the candidate's cgroup, its build
  directory, and in the timed phase the outside clock's drains, holds, twin and calibration.

Also the wall time of the CLI (``krex eval --json``, a fresh interpreter each time), for scale.
Prints the figures and writes ``benchmarks/out/eval_overhead-<date>.json``.

    python benchmarks/eval/eval_overhead.py [--runs 30] [--cli-runs 5] [--backend auto] [--reference R --candidate C]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import REPO, machine, percentile, wait_until, write_result

PROBLEM = REPO / "tests" / "evaluate" / "problems" / "kb_scaled_add"


#: the judge's defences, each as its verdict's metadata says what it took (seconds)
DEFENCES = {
    "spare_wait_s": "a clean spare ready (forked sandboxed from the zygote ahead of time)",
    "confine_s": "the sandbox's file part (landlock on the build directory)",
    "candidate_cgroup_s": "the candidate's own cgroup (its CPU time, its freeze, its task cap)",
    "build_dir_s": "its build directory emptied",
    "build_keep_s": "its compile cache kept",
}
#: the outside clock's parts (``metadata.timing_cost_ms``, milliseconds)
CLOCK = {
    "drain": "rounds ended from outside (the driver's lock on a GPU)",
    "hold": "the candidate held while the twin and the reference run",
    "twin": "the calibration twin found and warmed",
    "calibration": "the round trip calibrated in the region",
}


def defence_costs(meta: dict[str, Any]) -> dict[str, float]:
    """Seconds each defence took in one evaluation (those its metadata names)."""
    out = {k: float(meta[k]) for k in DEFENCES if k in meta}
    clock = meta.get("timing_cost_ms")
    if isinstance(clock, dict):
        out.update({k: float(v) / 1e3 for k, v in clock.items() if k in CLOCK})
    return out


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "p50_ms": round(percentile(values, 0.5) * 1e3, 3),
        "p95_ms": round(percentile(values, 0.95) * 1e3, 3),
        "min_ms": round(min(values) * 1e3, 3),
        "max_ms": round(max(values) * 1e3, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--cli-runs", type=int, default=5)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--reference", default=str(PROBLEM / "reference.py"))
    ap.add_argument("--candidate", default=str(PROBLEM / "correct.py"))
    args = ap.parse_args()

    runtime = Path(tempfile.mkdtemp(prefix="krex-eval-overhead-"))
    env = {
        **os.environ,
        "KREX_RUNTIME_DIR": str(runtime),
        "KREX_ENDPOINT": f"ipc://{runtime}/arbiter.sock",
        "KREX_POOL_ENDPOINT": f"ipc://{runtime}/pool.sock",
        "KREX_EVAL_CACHE": str(runtime / "cache"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
    }
    os.environ.update(env)
    with open(runtime / "arbiter.log", "wb") as arb_log, open(runtime / "pool.log", "wb") as pool_log:
        arbiter = subprocess.Popen(
            [sys.executable, "-m", "krex_lab.cli", "arbiter", "--backend", args.backend, "--fake-gpus", "1"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=arb_log,
        )
        wait_until(lambda: (runtime / "arbiter.sock").exists(), 30, "no arbiter socket")
        pool = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "krex_lab.workers.pool",
                "--Pool.preload=torch",
                "--workers-per-gpu=1",
                "--spares=1",
            ],
            env=env,
            stdout=pool_log,
            stderr=subprocess.STDOUT,
        )
    try:
        from krex_lab.evaluate import evaluate
        from krex_lab.workers.client import PoolClient

        wait_until(lambda: (runtime / "pool.sock").exists() or pool.poll() is not None, 60, "no pool socket")
        client = PoolClient.connect(start=False)
        wait_until(lambda: client.status().ready, 300, "the pool's workers were not ready")
        for _ in range(3):  # the first evaluations import and warm up what the later ones find
            first = evaluate(args.reference, args.candidate, pool=client)
        print(f"warm-up: {first.summary}", flush=True)
        walls: list[float] = []
        works: list[float] = []
        overheads: list[float] = []
        jobs: list[float] = []
        defences: dict[str, list[float]] = {}
        for _ in range(args.runs):
            t0 = time.perf_counter()
            ev = evaluate(args.reference, args.candidate, pool=client)
            wall = time.perf_counter() - t0
            if ev.verdict != "correct":
                raise SystemExit(f"eval_overhead: the candidate is not correct: {ev.summary}")
            work = ev.phases["total"]
            walls.append(wall)
            works.append(work)
            overheads.append(wall - work)
            jobs.append(ev.phases.get("job", float("nan")) - work)
            for name, seconds in defence_costs(ev.metadata).items():
                defences.setdefault(name, []).append(seconds)
        cli: list[float] = []
        for _ in range(args.cli_runs):
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "krex_lab.cli", "eval", "--json", args.reference, args.candidate],
                env=env,
                check=True,
                capture_output=True,
            )
            cli.append(time.perf_counter() - t0)
        result: dict[str, Any] = {
            "benchmark": "eval_overhead",
            "machine": machine(),
            "backend": args.backend,
            "device": ev.device,
            "gpu_timed": ev.gpu_timed,
            "reference": args.reference,
            "candidate": args.candidate,
            "runs": args.runs,
            "wall": summary(walls),
            "work": summary(works),
            "overhead": summary(overheads),
            "worker_outside_phases": summary(jobs),
            "cli_wall": summary(cli),
            "target_overhead_p50_ms": 50.0,
            "defences": {
                name: {"what": {**DEFENCES, **CLOCK}[name], **summary(values)} for name, values in defences.items()
            },
        }
        wall, work, over = result["wall"], result["work"], result["overhead"]
        inside = result["worker_outside_phases"]["p50_ms"]
        print(
            f"evaluate(): wall p50 {wall['p50_ms']:.1f} ms, work p50 {work['p50_ms']:.1f} ms, overhead p50 "
            f"{over['p50_ms']:.1f} ms (p95 {over['p95_ms']:.1f} ms; target <= 50 ms); in the worker outside the "
            f"phases p50 {inside:.1f} ms",
            flush=True,
        )
        print("what each defence cost an evaluation (ms):", flush=True)
        for name, row in result["defences"].items():
            print(f"  {name:20s} p50 {row['p50_ms']:9.2f}  p95 {row['p95_ms']:9.2f}  {row['what']}", flush=True)
        if cli:
            cli_p50 = result["cli_wall"]["p50_ms"]
            print(f"krex eval --json (a fresh interpreter each): wall p50 {cli_p50:.0f} ms", flush=True)
        write_result("eval_overhead", result)
    finally:
        for proc in (pool, arbiter):
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
