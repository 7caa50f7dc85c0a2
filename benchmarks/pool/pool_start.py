"""How long a pool of N warm workers takes to start: to its first worker ready (a batch may begin
there) and to all N, for each ``--concurrency`` (the pool's ``start_concurrency``: workers started
at once; 0 = its default, the node's CPUs). A private arbiter and pool each time (``krex pool
--workers-per-gpu N --spares 0``, torch preloaded), stopped after.

    python benchmarks/pool/pool_start.py --backend nvidia --workers 16 --concurrency 2,0 --repeat 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "agent")]  # benchmarks/: common; agent_world

from agent_world import World  # noqa: E402
from common import machine, write_result  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="fake", choices=["fake", "nvidia"])
    p.add_argument("--workers", type=int, default=16, help="active workers on the GPU")
    p.add_argument("--concurrency", default="2,0", help="start_concurrency values, comma-separated (0: the default)")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--preload", default="torch", help="modules each worker imports at start, comma-separated")
    p.add_argument("--out", default="", help="write the JSON here instead of benchmarks/out/")
    args = p.parse_args(argv)
    args.concurrency = [int(x) for x in args.concurrency.split(",") if x != ""]
    if args.workers < 1 or not args.concurrency or any(c < 0 for c in args.concurrency):
        p.error("--workers >= 1 and --concurrency values >= 0")
    return args


def one(args: argparse.Namespace, concurrency: int) -> dict[str, Any]:
    world_args = argparse.Namespace(
        use_arbiter=False,
        backend=args.backend,
        gpus=1,
        pool_memory_slack_mb=None,
        pool_start_concurrency=concurrency or None,
    )
    with tempfile.TemporaryDirectory(prefix="krex-poolstart-") as tmp:
        runtime = Path(tmp) / "runtime"
        runtime.mkdir(mode=0o700)
        world = World(world_args, runtime)
        try:
            world.start_arbiter()
            t0 = time.monotonic()
            ready_s = world.start_pool(args.workers, [m for m in args.preload.split(",") if m])
            return {
                "start_concurrency": concurrency or "default",
                "first_worker_s": world.first_worker_s,
                "all_ready_s": ready_s,
                "wall_s": time.monotonic() - t0,
            }
        finally:
            world.stop()


def main(argv: list[str] | None = None) -> Path:
    args = parse(argv)
    if args.backend == "fake":
        print("pool_start: FAKE backend - no GPU: torch imports and process starts only", flush=True)
    runs = []
    for _ in range(args.repeat):
        for c in args.concurrency:
            r = one(args, c)
            runs.append(r)
            print(
                f"start_concurrency {r['start_concurrency']}: first worker {r['first_worker_s']:.1f} s, "
                f"all {args.workers} {r['all_ready_s']:.1f} s",
                flush=True,
            )
    result = {
        "benchmark": "pool_start",
        "backend": args.backend,
        "simulated": args.backend == "fake",
        "machine": machine(),
        "parameters": {k: v for k, v in vars(args).items() if k != "out"},
        "runs": runs,
    }
    if args.out:
        path = Path(args.out)
        import json

        path.write_text(json.dumps(result, indent=1))
    else:
        path = write_result(f"pool_start-{args.backend}", result)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
