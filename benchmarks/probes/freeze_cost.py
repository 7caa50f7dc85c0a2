"""The freeze's CPU cost per region: stop N sleeping siblings, wait for the stops, settle, thaw.

    python benchmarks/probes/freeze_cost.py                       # 63 siblings, 300 cycles, this tree
    python benchmarks/probes/freeze_cost.py --trees .,.before     # two trees in turn, A B A B (--pairs 3)

A cycle is what the arbiter does to a GPU's siblings in one region, with the same calls
(``Freezer.freeze``, ``pending`` until every stop has shown, ``settle``, ``thaw``) on real
``sleep`` processes, in one process and without the arbiter around it: ``scale.py`` measures the
whole region sequence under load, where a shared 2-core machine swings regions/s by a third from
run to run; this isolates the freeze. ``--trees`` measures other source trees (a ``git archive``
of an earlier commit unpacked in a directory) in turn with this one, so both see the same
machine. Prints CPU and wall milliseconds per cycle; writes
``benchmarks/out/freeze_cost-<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import REPO, machine, write_result

CYCLES = """
import json, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from krex_lab.enforcement.freeze import Freezer, FreezeResult, thaw
n, cycles = int(sys.argv[2]), int(sys.argv[3])
kids = [subprocess.Popen(["sleep", "3600"]) for _ in range(n)]
pids = [k.pid for k in kids]
freezer = Freezer(record=lambda *a, **k: None)

def wait(result):
    waiting = freezer.pending(result)
    while waiting:
        waiting = freezer.pending(result, among=waiting)

def cycle():
    result = FreezeResult()
    freezer.freeze("r", pids, set(), result)
    looked_at = len(result.procs), len(result.cgroups)
    wait(result)  # the grant waits for the stops
    if hasattr(result, "seen_landed"):  # trees before 2026-12-02 15:00 have none
        result.seen_landed(*looked_at)
    wait(result)  # the settle: stops made since, then the walk
    freezer.settle("r", result, pids, set())
    result.landed()
    thaw(result)

try:
    for _ in range(20):
        cycle()
    t0, w0 = time.process_time(), time.perf_counter()
    for _ in range(cycles):
        cycle()
    print(json.dumps({"cpu_ms": 1e3 * (time.process_time() - t0) / cycles,
                      "wall_ms": 1e3 * (time.perf_counter() - w0) / cycles}))
finally:
    for k in kids:
        k.kill()
"""


def run(tree: Path, siblings: int, cycles: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CYCLES, str(tree), str(siblings), str(cycles)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--siblings", type=int, default=63, help="sleeping siblings frozen each cycle (scale.py: 63)")
    p.add_argument("--cycles", type=int, default=300, help="cycles timed per run (after 20 not timed)")
    p.add_argument("--trees", default=".", help="source trees, comma-separated, run in turn (paths from the repo root)")
    p.add_argument("--pairs", type=int, default=3, help="runs of each tree, interleaved")
    args = p.parse_args()
    trees = [(REPO / t).resolve() for t in args.trees.split(",")]
    runs: dict[str, list[dict[str, float]]] = {str(t): [] for t in trees}
    for _ in range(args.pairs):
        for t in trees:
            r = run(t, args.siblings, args.cycles)
            runs[str(t)].append(r)
            print(f"{t}: {r['cpu_ms']:.3f} ms CPU, {r['wall_ms']:.3f} ms wall a cycle of {args.siblings}", flush=True)
    summary: dict[str, Any] = {
        t: {
            "cpu_ms_median": round(statistics.median(r["cpu_ms"] for r in rs), 3),
            "wall_ms_median": round(statistics.median(r["wall_ms"] for r in rs), 3),
            "cpu_us_per_sibling": round(1e3 * statistics.median(r["cpu_ms"] for r in rs) / args.siblings, 1),
        }
        for t, rs in runs.items()
    }
    for t, s in summary.items():
        print(f"{t}: median {s['cpu_ms_median']:.3f} ms CPU a cycle ({s['cpu_us_per_sibling']} us a sibling)")
    write_result(
        "freeze_cost",
        {
            "benchmark": "freeze_cost",
            "machine": machine(),
            "command": " ".join(sys.argv),
            "siblings": args.siblings,
            "cycles": args.cycles,
            "runs": runs,
            "summary": summary,
        },
    )


if __name__ == "__main__":
    main()
