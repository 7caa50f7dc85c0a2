"""KREX on a local multi-node Ray cluster: evaluation rate with 1, 2 and 3 nodes.

Every node runs on this machine (``ray.cluster_utils.Cluster``), each with its own KREX runtime
dir, a fake-backend arbiter with ``--gpus`` GPUs and a pool of warm context workers. Candidates
are ``simulated_kernel`` calls (a sleep: the simulated GPU phase), timed ``--repeat`` times in a
region of their node's arbiter; evaluations take ``--fraction`` of a ``krex_gpu``. The JSON says
the GPU phases were simulated. Usage::

    .venv/bin/python benchmarks/multigpu/ray_cluster.py [--evals 72] [--gpu-s 0.25] [--nodes 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import machine, write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=2, help="fake GPUs per node")
    ap.add_argument("--evals", type=int, default=72, help="evaluations per measurement")
    ap.add_argument("--gpu-s", type=float, default=0.25, help="simulated GPU phase of one call (s)")
    ap.add_argument("--repeat", type=int, default=2, help="timed calls per evaluation")
    ap.add_argument("--fraction", type=float, default=0.5, help="krex_gpu per evaluation")
    ap.add_argument("--workers-per-gpu", type=int, default=2)
    args = ap.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    import krex_lab.ray as kr
    from krex_lab.ray.candidate import simulated_kernel

    tmp = Path(tempfile.mkdtemp(prefix="krex-ray-bench-"))
    # Every "node" shares this machine's cores: core reservation (isolate_cores) is a real node's business;
    # with it, the arbiters of the simulated nodes pin their holders to the same core (acquire 22 -> 300 ms).
    config = kr.NodeConfig(
        backend="fake",
        preload=(),
        workers_per_gpu=args.workers_per_gpu,
        spares_per_gpu=0,
        arbiter_args=("--Arbiter.isolate_cores=0",),
    )
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "object_store_memory": 80 << 20},
    )

    def add_node(i: int) -> None:
        rt = tmp / f"node{i}"
        rt.mkdir(mode=0o700)
        cluster.add_node(
            num_cpus=1,
            resources={"krex_gpu": args.gpus},
            env_vars={"KREX_RUNTIME_DIR": str(rt)},
            object_store_memory=80 << 20,
        )

    def batch(n: int, tag: str) -> tuple[float, list[Any]]:
        cands = [
            kr.Candidate(simulated_kernel, (args.gpu_s,), name=f"{tag}{i}", key=i, repeat=args.repeat) for i in range(n)
        ]
        t0 = time.monotonic()
        res = list(kr.evaluate(cands, config=config, fraction=args.fraction, progress=True, desc=tag, timeout=600))
        return time.monotonic() - t0, res

    rows: list[dict[str, Any]] = []
    try:
        add_node(0)
        ray.init(address=cluster.address, namespace="krex", log_to_driver=False)
        for n in range(1, args.nodes + 1):
            if n > 1:
                add_node(n - 1)
                cluster.wait_for_nodes()
            kr.start_nodes(config)
            batch(4 * n * args.gpus, f"warm-{n}-")
            seconds, res = batch(args.evals, f"{n} node(s) ")
            holds = [r.region["hold_s"] for r in res if r.region]
            acquires = [r.region["acquire_s"] for r in res if r.region]
            phases = {
                f"{p}_s_median": round(statistics.median(r.region.get(f"{p}_s", 0.0) for r in res if r.region), 4)
                for p in ("wait", "drain", "freeze", "isolate")
            }
            row = {
                "nodes": n,
                "gpus": n * args.gpus,
                "evaluations": len(res),
                "ok": sum(r.ok for r in res),
                "seconds": round(seconds, 3),
                "rate_per_s": round(len(res) / seconds, 3),
                "bound_per_s": round(n * args.gpus / (args.gpu_s * args.repeat), 3),
                "per_node": {k: sum(1 for r in res if r.node == k) for k in sorted({str(r.node) for r in res})},
                "hold_s_median": round(statistics.median(holds), 4),
                "acquire_s_median": round(statistics.median(acquires), 4),
                **phases,
                "degraded": sum(1 for r in res if r.region.get("degraded")),
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            }
            rows.append(row)
            print(
                f"{n} node(s), {n * args.gpus} GPUs: {row['rate_per_s']:.2f} evals/s "
                f"(bound {row['bound_per_s']:.1f}/s), acquire p50 {row['acquire_s_median'] * 1e3:.0f} ms "
                f"(drain {row['drain_s_median'] * 1e3:.0f}, isolate {row['isolate_s_median'] * 1e3:.0f}), "
                f"load {row['loadavg_after']}",
                flush=True,
            )
        status = kr.cluster_status(resource="krex_gpu")
        print(kr.format_cluster(status))
    finally:
        try:
            kr.stop_nodes()
        finally:
            ray.shutdown()
            cluster.shutdown()
    ratio = rows[-1]["rate_per_s"] / rows[0]["rate_per_s"]
    print(f"rate {rows[-1]['nodes']} nodes / 1 node: {ratio:.2f}x")
    write_result(
        "ray_cluster-fake",
        {
            "machine": machine(),
            "ray": ray.__version__,
            "simulated_gpu_phases": True,
            "backend": "fake",
            "args": vars(args),
            "rows": rows,
            "ratio_last_vs_1": round(ratio, 3),
            "argv": sys.argv,
        },
    )


if __name__ == "__main__":
    main()
