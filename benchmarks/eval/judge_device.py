"""One evaluation at a time on a warm worker, phase by phase: what the judge's split costs.

    python benchmarks/eval/judge_device.py [--backend nvidia|fake] [--repeat 3] [--problems 15,13,04]

Starts an arbiter and a pool (one worker, torch preloaded: its zygote is made at start), then
evaluates each problem's reference as its own candidate ``--repeat`` times (``EVAL_PROBLEM_SIZE=small``:
the problems' CPU-sized inputs) (the first evaluation
on the worker included), and prints wall time and the load / check / time phases of each, with
the outside bound and the in-process figure. JSON to ``benchmarks/out/judge-<backend>-<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))  # agent_world
from agent_world import World
from common import REPO


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="nvidia")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--problems", default="15,13,04,11")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from krex_lab.evaluate import evaluate

    probs = sorted((REPO / "benchmarks" / "eval_problems").iterdir())
    chosen = [p for p in probs if p.is_dir() and p.name.split("_")[0] in a.problems.split(",")]
    rows = []
    import tempfile

    from krex_lab.workers.client import PoolClient

    runtime = Path(tempfile.mkdtemp(prefix="krex-judge-"))
    world = World(
        argparse.Namespace(use_arbiter=False, backend=a.backend, gpus=1, pool_memory_slack_mb=None), runtime / "rt"
    )
    (runtime / "rt").mkdir(mode=0o700)
    world.env["KREX_EVAL_CACHE"] = str(runtime / "cache")
    os.environ.update({k: v for k, v in world.env.items() if k.startswith("KREX_")})
    world.start_arbiter()
    print(f"pool ready in {world.start_pool(1, ['torch']):.1f} s", flush=True)
    pool = PoolClient.connect(world.env["KREX_POOL_ENDPOINT"], start=False)
    try:
        for p in chosen:
            ref = p / "reference.py"
            # the reference as its own candidate (its Model under the candidate's name), read as text
            cand = p / "new_torch.py" if (p / "new_torch.py").exists() else ref.read_text() + "\nModelNew = Model\n"
            for k in range(a.repeat):
                t0 = time.perf_counter()
                ev = evaluate(ref, cand, pool=pool, retime_reference=k == 0)
                wall = time.perf_counter() - t0
                row = {
                    "problem": p.name,
                    "repeat": k,
                    "verdict": ev.verdict,
                    "wall_s": round(wall, 4),
                    "phases": ev.phases,
                    "runtime_us": ev.runtime,
                    "ref_runtime_us": ev.ref_runtime,
                    "speedup": ev.speedup,
                    "method": ev.timing_method,
                    "bound_us": ev.metadata.get("timing_bound_us"),
                    "overhead_us": ev.metadata.get("timing_overhead_us"),
                    "roundtrip_us": ev.metadata.get("timing_roundtrip_us"),
                    "wall_us": ev.metadata.get("timing_wall_us"),
                    "accounting": ev.metadata.get("timing_accounting"),
                    "outside_used": "timing_bound" in ev.metadata,
                    "defence_ms": ev.metadata.get("timing_cost_ms"),
                    "cgroup_s": ev.metadata.get("candidate_cgroup_s"),
                    "spare_wait_s": ev.metadata.get("spare_wait_s"),
                    "summary": ev.summary,
                }
                rows.append(row)
                print(
                    f"{p.name:22s} #{k} {ev.verdict:10s} wall {wall:6.3f} s  load {ev.phases.get('load', 0):.3f} "
                    f"check {ev.phases.get('check', 0):.3f} time {ev.phases.get('time', 0):.3f}  "
                    f"{ev.runtime:.2f} us (bound {row['bound_us']}, round trip {row['roundtrip_us']}) "
                    f"ref {ev.ref_runtime:.2f} us",
                    flush=True,
                )
    finally:
        pool.close()
        world.stop()
    out = {
        "machine": platform.node(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "revision": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
        ).stdout.strip(),
        "backend": a.backend,
        "rows": rows,
    }
    path = Path(a.out or REPO / "benchmarks" / "results" / f"judge-{a.backend}-{datetime.now():%Y-%m-%dT%H%M}.json")
    path.write_text(json.dumps(out, indent=1))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], path.name).write_text(json.dumps(out, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
