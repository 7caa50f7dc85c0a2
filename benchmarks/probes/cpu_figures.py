"""How steady the judge's CPU figure is: honest candidates judged again and again on the fake
backend (no GPU), in turn in one warm pool (``--fresh``: each in a pool of its own), for two cases
at the two ends of the CPU harness's range:

* ``small``: ``a + b + c`` on 1000 values (tests/evaluate/problems/kb_add3), a call of a few
  microseconds under a harness that costs about a hundred;
* ``large``: the reference's own ``2 x + 1`` as the candidate, on one case of 4 Mi values
  (tests/evaluate/problems/gm_vector_scale), a ~2 ms kernel under ~17 ms of harness a call.

    python benchmarks/probes/cpu_figures.py --runs 6

Prints each figure (us a call, and the speedup against the reference) and their spread; writes
``benchmarks/out/cpu_figures-<date>.json`` with each evaluation's ``timing_split_us``. ``--tree
DIR`` judges with another tree's krex_lab (its pool and judge), for a before/after.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # common
sys.path.insert(0, str(ROOT))
from common import machine, private_arbiter, wait_until, write_result  # noqa: E402

from krex_lab.evaluate import evaluate  # noqa: E402
from krex_lab.workers.client import PoolClient  # noqa: E402

PROBLEMS = ROOT / "tests" / "evaluate" / "problems"
#: the evaluation pool's options in the tests (tests/evaluate/conftest.py)
POOL_ARGS = ["--Pool.preload=torch", "--workers-per-gpu=2", "--spares=1"]
#: the tree whose krex_lab the pool runs (``--tree``; empty: this one)
TREE = [""]
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


@contextlib.contextmanager
def pool(on_demand: bool = False) -> Iterator[PoolClient]:
    """A pool (one fake GPU, two workers, torch preloaded, as the tests' is) beside an arbiter,
    both fresh, on a private runtime dir; ``on_demand``: the pool ``evaluate()`` starts when none
    answers (its own defaults, no arbiter), as a user without a lab gets."""
    arbiter, env = private_arbiter("krex-cpufig-", "--backend", "fake", "--fake-gpus", "1")
    runtime = Path(env["KREX_RUNTIME_DIR"])
    endpoint = f"ipc://{runtime}/pool.sock"
    path = os.pathsep.join(filter(None, [TREE[0], env["PYTHONPATH"]]))
    if on_demand:
        arbiter.terminate()
        arbiter.wait(30)
        env = {k: v for k, v in env.items() if k != "KREX_ENDPOINT"}
    with open(runtime / "pool.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "krex_lab.workers.pool", f"--endpoint={endpoint}"]
            + (["--on-demand"] if on_demand else POOL_ARGS),
            env={**env, "KREX_POOL_ENDPOINT": endpoint, "PYTHONPATH": path},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        client = connected(endpoint, proc)
        wait_until(lambda: client.status().ready, 120, "the pool's workers")
        yield client
    finally:
        for p in (proc, arbiter):
            if p.poll() is None:
                p.terminate()
                p.wait(30)


def judged(case: str, client: PoolClient) -> dict[str, Any]:
    spec = CASES[case]
    ev = evaluate(
        PROBLEMS / spec["problem"] / "reference.py",
        PROBLEMS / spec["problem"] / spec["candidate"],
        pool=client,
        **spec["options"],
    )
    meta = ev.metadata
    return {
        "verdict": ev.verdict,
        "runtime_us": round(ev.runtime, 3),
        "speedup": None if ev.speedup is None else round(ev.speedup, 4),
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
    ap.add_argument(
        "--tree",
        help="another tree (git archive REV krex_lab | tar -x -C DIR) whose krex_lab the pool runs: the judge, "
        "the twin and the candidate's process, for a before/after",
    )
    ap.add_argument("--fresh", action="store_true", help="each evaluation in a pool of its own")
    ap.add_argument("--on-demand", action="store_true", help="the pool evaluate() starts on its own (no arbiter)")
    args = ap.parse_args()
    if args.tree:
        TREE[0] = str(Path(args.tree).resolve())
    report: dict[str, Any] = {
        "benchmark": "cpu figures",
        "backend": "fake",
        "tree": args.tree or "this one",
        "pools": ("one for each evaluation" if args.fresh else "one for all, the cases in turn")
        + (", started on demand (no arbiter)" if args.on_demand else ", the tests' options beside an arbiter"),
        "command": " ".join(["python", *sys.argv]),
        "machine": machine(),
        "cases": {},
    }
    cases = args.cases.split(",")
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    if args.fresh:
        for case in cases:
            for _ in range(args.runs):
                with pool(args.on_demand) as client:
                    results[case].append(judged(case, client))
    else:  # one pool, the cases in turn, as a warm pool serves them (the tests' pool, a user's)
        with pool(args.on_demand) as client:
            for _ in range(args.runs):
                for case in cases:
                    results[case].append(judged(case, client))
    for case, runs in results.items():
        figures = [r["runtime_us"] for r in runs if r["verdict"] == "correct"]
        speedups = [r["speedup"] for r in runs if r["speedup"] is not None]
        summary = {
            "figures_us": figures,
            "speedups": speedups,
            "median_us": round(statistics.median(figures), 3) if figures else None,
            "max_over_min": round(max(figures) / min(figures), 2) if figures and min(figures) > 0 else None,
        }
        report["cases"][case] = {"runs": runs, **summary}
        print(
            f"{case}: figures {figures} us (median {summary['median_us']}, max/min {summary['max_over_min']}); "
            f"speedups {speedups}"
        )
    write_result("cpu_figures" + (f"-{Path(args.tree).name}" if args.tree else ""), report)


if __name__ == "__main__":
    main()
