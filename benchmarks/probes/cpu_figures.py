"""How steady the judge's CPU figure is: one honest candidate judged again and again on the fake
backend (no GPU), each time in a pool of its own, for two cases at the two ends of the CPU
harness's range:

* ``small``: ``a + b + c`` on 1000 values (tests/evaluate/problems/kb_add3), a call of a few
  microseconds under a harness that costs about a hundred;
* ``large``: the reference's own ``2 x + 1`` as the candidate, on one case of 4 Mi values
  (tests/evaluate/problems/gm_vector_scale), a ~2 ms kernel under ~17 ms of harness a call.

    python benchmarks/probes/cpu_figures.py --runs 6

Prints each figure (us a call, and the speedup against the reference), their spread, and how
many fell back to the candidate's raw CPU time (a corrected figure at or below zero); writes
``benchmarks/out/cpu_figures-<date>.json`` with each evaluation's ``timing_split_us``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # common
sys.path.insert(0, str(ROOT))
from common import machine, private_arbiter, wait_until, write_result  # noqa: E402

from krex_lab.evaluate import evaluate  # noqa: E402
from krex_lab.workers.client import PoolClient  # noqa: E402

PROBLEMS = ROOT / "tests" / "evaluate" / "problems"
CASES: dict[str, dict[str, Any]] = {
    "small": {"problem": "kb_add3", "candidate": "correct.py", "options": {"perf_trials": 30}},
    "large": {
        "problem": "gm_vector_scale",
        "candidate": "same_as_reference.py",
        "options": {
            "benchmarks": ["size: 4194304; seed: 12"],
            "timeouts": {"load": 120.0, "check": 60.0, "time": 120.0},
        },
    },
}


def judged(case: str) -> dict[str, Any]:
    """One evaluation of ``case`` in a fresh pool (one fake GPU, torch preloaded, as the tests'
    pool is) beside a fresh arbiter: its first evaluation, no judge warmed by another."""
    spec = CASES[case]
    arbiter, env = private_arbiter("krex-cpufig-", "--backend", "fake", "--fake-gpus", "1")
    runtime = Path(env["KREX_RUNTIME_DIR"])
    endpoint = f"ipc://{runtime}/pool.sock"
    with open(runtime / "pool.log", "w") as log:
        pool = subprocess.Popen(
            [sys.executable, "-m", "krex_lab.workers.pool", f"--endpoint={endpoint}", "--Pool.preload=torch"],
            env={**env, "KREX_POOL_ENDPOINT": endpoint},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        client = connected(endpoint, pool)
        wait_until(lambda: client.status().ready, 120, "the pool's workers")
        ev = evaluate(
            PROBLEMS / spec["problem"] / "reference.py",
            PROBLEMS / spec["problem"] / spec["candidate"],
            pool=client,
            **spec["options"],
        )
    finally:
        for proc in (pool, arbiter):
            proc.terminate()
            proc.wait(30)
    meta = ev.metadata
    return {
        "verdict": ev.verdict,
        "runtime_us": round(ev.runtime, 3),
        "speedup": None if ev.speedup is None else round(ev.speedup, 4),
        "raw_fallback": "timing_bound" in meta,
        "timing_split_us": meta.get("timing_split_us"),
        "timing_wall_us": meta.get("timing_wall_us"),
    }


def connected(endpoint: str, pool: subprocess.Popen[bytes], timeout: float = 60) -> PoolClient:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return PoolClient.connect(endpoint, start=False)
        except Exception:
            if pool.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the pool did not start (exit {pool.poll()})") from None
            time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=6, help="evaluations of each case")
    ap.add_argument("--cases", default="small,large", help="comma-separated: small, large")
    args = ap.parse_args()
    report: dict[str, Any] = {"benchmark": "cpu figures", "backend": "fake", "machine": machine(), "cases": {}}
    for case in args.cases.split(","):
        runs = [judged(case) for _ in range(args.runs)]
        figures = [r["runtime_us"] for r in runs if r["verdict"] == "correct"]
        speedups = [r["speedup"] for r in runs if r["speedup"] is not None]
        summary = {
            "figures_us": figures,
            "speedups": speedups,
            "median_us": round(statistics.median(figures), 3) if figures else None,
            "max_over_min": round(max(figures) / min(figures), 2) if figures and min(figures) > 0 else None,
            "raw_fallbacks": sum(r["raw_fallback"] for r in runs),
        }
        report["cases"][case] = {"runs": runs, **summary}
        print(
            f"{case}: figures {figures} us (median {summary['median_us']}, max/min {summary['max_over_min']}); "
            f"speedups {speedups}; {summary['raw_fallbacks']} of {len(runs)} fell back to the raw CPU time"
        )
    print(f"wrote {write_result('cpu_figures', report)}")


if __name__ == "__main__":
    main()
