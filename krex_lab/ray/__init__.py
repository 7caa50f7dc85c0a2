"""KREX on a Ray cluster: one arbiter and one pool per node, evaluations placed by Ray.

    import ray, krex_lab.ray as kr
    ray.init(address="auto")
    for result in kr.evaluate([kr.Candidate(my_kernel, (x,)) for x in inputs]):
        print(result.node, result.gpu, result.best, result.region.hold_s)
    print(kr.format_cluster(kr.cluster_status()))      # also: krex status --ray
    kr.cluster_dashboard()                             # in a notebook: every node's GPUs, live

Importing this package imports nothing of Ray: the names below load their module on first use
(:mod:`.candidate`, which the context workers unpickle, never imports Ray). See docs/cluster.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .candidate import Candidate, run_candidate, simulated_kernel
    from .cluster import cluster_status, start_nodes, stop_nodes
    from .dashboard import ClusterDashboard, cluster_dashboard
    from .fleet import EvalResult, evaluate, submit
    from .node import NodeConfig, NodeService
    from .status import format_cluster

_WHERE = {
    "Candidate": ".candidate",
    "run_candidate": ".candidate",
    "simulated_kernel": ".candidate",
    "NodeConfig": ".node",
    "NodeService": ".node",
    "cluster_status": ".cluster",
    "cluster_dashboard": ".dashboard",
    "ClusterDashboard": ".dashboard",
    "start_nodes": ".cluster",
    "stop_nodes": ".cluster",
    "EvalResult": ".fleet",
    "evaluate": ".fleet",
    "submit": ".fleet",
    "format_cluster": ".status",
}

__all__ = [
    "Candidate",
    "ClusterDashboard",
    "EvalResult",
    "NodeConfig",
    "NodeService",
    "cluster_dashboard",
    "cluster_status",
    "evaluate",
    "format_cluster",
    "run_candidate",
    "simulated_kernel",
    "start_nodes",
    "stop_nodes",
    "submit",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
