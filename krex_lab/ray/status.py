"""``krex status --ray``: every KREX node of a Ray cluster, gathered through Ray (each node
actor's ``status()``): its GPUs, holders, queues and sessions (the node's own table), and its pool."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cluster import ClusterNode


def format_cluster(nodes: list[ClusterNode]) -> str:
    """One block per node: a header line, the arbiter's table (indented), the pool's workers."""
    from krex_lab.node_status import format_table

    lines = [f"Ray cluster: {len(nodes)} node(s) with KREX"]
    for n in nodes:
        head = f"== node {n.node} ({n.address or n.hostname or '?'})"
        if n.runtime_dir:
            how = ", ".join(f"{k} {'started by Ray' if v else 'the node service'}" for k, v in n.owned.items())
            head += f"  runtime {n.runtime_dir}" + (f"  [{how}]" if how else "")
        lines.append(head)
        if n.error:
            lines.append(f"  {n.error}")
            continue
        if n.arbiter is not None:
            lines.extend("  " + line for line in format_table(n.arbiter).splitlines())
        else:
            lines.append(f"  arbiter: {n.arbiter_error or 'no answer'}")
        pool = n.pool
        if pool is None:
            lines.append(f"  pool: {n.pool_error or 'no answer'}")
            continue
        workers = [w for g in pool.gpus for w in g.workers]
        busy = sum(1 for w in workers if w.state not in ("idle", "ready", "spare"))
        lines.append(f"  pool pid {pool.pool.pid}: {len(workers)} workers, {busy} busy, {len(pool.queue)} queued")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import msgspec
    import ray

    from .cluster import cluster_status

    address = args.ray_address or "auto"
    try:
        ray.init(address=address, namespace="krex", log_to_driver=False, logging_level="WARNING")
    except ConnectionError:
        where = f"at {address}" if address != "auto" else "on this machine (no RAY_ADDRESS, no `ray start`)"
        print(
            f"krex status --ray: no Ray cluster answers {where}: start one (`ray start --head`) or give "
            "--ray-address; `krex status` without --ray shows this node",
            file=sys.stderr,
        )
        return 1
    try:
        nodes = cluster_status()
    finally:
        ray.shutdown()
    print(msgspec.json.format(msgspec.json.encode(nodes), indent=2).decode() if args.json else format_cluster(nodes))
    return 0
