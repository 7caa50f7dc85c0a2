"""The node actors on a Ray cluster: start (or find) one per KREX node, ask them for status.

A KREX node is a live Ray node that declares the config's ``resource`` (``krex_gpu`` on the fake
backend, ``GPU`` on real ones). :func:`node_actor` gets-or-creates the node's actor atomically (a
named, detached actor, ``get_if_exists``), so a driver (:func:`start_nodes`) and an evaluation
task that lands on a node nobody prepared (:func:`local_node`) agree on one service per node.
"""

from __future__ import annotations

import threading
import time
from typing import Any, TypedDict

import msgspec
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .node import NAMESPACE, NodeConfig, NodeInfo, NodeService, NodeStatus, actor_name

#: the Ray actor class of :class:`NodeService` (no CPU: it only starts processes and answers status;
#: threaded, so that a slow status never delays another caller)
NodeActor = ray.remote(num_cpus=0, max_concurrency=4)(NodeService)


class ClusterNode(NodeStatus, kw_only=True, omit_defaults=True):
    """One live Ray node in :func:`cluster_status`: its node actor's :class:`NodeStatus`, Ray's
    ``address`` and ``resources`` for it, or the ``error`` saying why it has no status (no KREX
    service, no answer). Read by ``krex status --ray`` and the cluster dashboard."""

    address: str | None = None
    resources: dict[str, float] = {}
    error: str | None = None


class RayNode(TypedDict):
    """An entry of ``ray.nodes()`` (Ray's own dict; the keys read here)."""

    NodeID: str
    Alive: bool
    NodeManagerAddress: str
    #: resource name -> amount the node declares
    Resources: dict[str, float]


def krex_nodes(resource: str) -> list[RayNode]:
    """Live Ray nodes that declare ``resource`` (``ray.nodes()`` entries)."""
    nodes: list[RayNode] = ray.nodes()
    return [n for n in nodes if n.get("Alive") and n.get("Resources", {}).get(resource, 0) > 0]


def node_actor(node_id: str, config: NodeConfig, resources: float | None = None) -> Any:
    """The node's actor handle: the running one, or a new one pinned there (``soft=False``)."""
    return NodeActor.options(
        name=actor_name(node_id),
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        max_restarts=0,
    ).remote(config, node_id, resources)


def start_nodes(config: NodeConfig | None = None, timeout: float = 120.0) -> list[NodeInfo]:
    """Start (or find) the KREX service of every KREX node; returns each node's ``info()``."""
    config = config or NodeConfig()
    nodes = krex_nodes(config.resource)
    actors = [node_actor(n["NodeID"], config, n["Resources"][config.resource]) for n in nodes]
    infos: list[NodeInfo] = ray.get([a.info.remote() for a in actors], timeout=timeout)
    return infos


def find_actor(node_id: str) -> Any | None:
    """The node's actor if it runs, else None."""
    try:
        return ray.get_actor(actor_name(node_id), namespace=NAMESPACE)
    except ValueError:
        return None


def stop_nodes(timeout: float = 30.0) -> None:
    """Stop every node service (what they started ends; found services stay) and end their actors."""
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        actor = find_actor(n["NodeID"])
        if actor is None:
            continue
        try:
            ray.get(actor.stop.remote(), timeout=timeout)
        except Exception:
            pass
        ray.kill(actor)


_local: dict[str, NodeInfo] = {}
_local_lock = threading.Lock()


def local_node(config: NodeConfig) -> NodeInfo:
    """``info()`` of the node service of the node this task runs on (cached per process; started if missing)."""
    node_id = ray.get_runtime_context().get_node_id()
    with _local_lock:
        info = _local.get(node_id)
        if info is None:
            resources = ray.get_runtime_context().get_assigned_resources()
            total = next((n["Resources"].get(config.resource) for n in ray.nodes() if n["NodeID"] == node_id), None)
            actor = node_actor(node_id, config, total or resources.get(config.resource))
            info = _local[node_id] = ray.get(actor.info.remote(), timeout=config.start_timeout + 30)
        return info


def cluster_status(resource: str | None = None, timeout: float = 20.0) -> list[ClusterNode]:
    """Every live Ray node's KREX status, gathered from its node actor (``status()``), in node order.

    A node without a KREX service says so (``error``); so does one whose actor did not answer in
    ``timeout`` seconds. ``resource``: only nodes declaring it (None: every live node).
    """
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if resource is not None:
        nodes = [n for n in nodes if n.get("Resources", {}).get(resource, 0) > 0]
    calls: dict[str, ray.ObjectRef[NodeStatus]] = {}
    out: list[ClusterNode] = []
    for n in nodes:
        actor = find_actor(n["NodeID"])
        if actor is not None:
            calls[n["NodeID"]] = actor.status.remote()
    deadline = time.monotonic() + timeout
    for n in nodes:
        node_id, address, resources = n["NodeID"], n.get("NodeManagerAddress"), n.get("Resources", {})
        ref = calls.get(node_id)
        if ref is None:
            error = "no KREX node service on this node"
            out.append(
                ClusterNode(node_id=node_id, node=node_id[:8], address=address, resources=resources, error=error)
            )
            continue
        try:
            status: NodeStatus = ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
            out.append(ClusterNode(**msgspec.structs.asdict(status), address=address, resources=resources))
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            out.append(
                ClusterNode(node_id=node_id, node=node_id[:8], address=address, resources=resources, error=error)
            )
    return out
