"""A CPU-timed case holds every GPU's region of the node, not its own GPU's alone.

Without a GPU (the fake backend) a candidate's figure is its own cgroup's CPU time, and the
processors are the whole node's: a region freezes only its own GPU's other jobs, so a candidate
judged at the same time on another GPU could still run, and do the timed candidate's work for it
(through memory both can map: ``/dev/shm``, or any covert channel), its CPU time then charged to
its own cgroup. Holding every GPU's region freezes every other job of the node, other
candidates included, while the case is timed. (On a GPU the judge's bracket of each round counts
any wait for such a helper: its own GPU's region is enough.)

The regions are taken in the order of their GPUs' indices, by every judge alike, so that two
judges never each hold one the other waits for.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["hold_node", "release_all"]


def hold_node(own: Any, max_hold: float) -> list[Any]:
    """``own`` (this job's region, not yet acquired) and a region of every other GPU of the node,
    acquired in GPU order; the others returned (release them with :func:`release_all` after
    ``own``). Raises, holding none of them, where one cannot be had."""
    from ...client import attach, current_session, exclusive, status
    from ...node_status import NodeStatus

    session = current_session() or attach(None)
    mine = session.gpu
    if mine is None:  # no GPU to name (nothing else to hold)
        own.acquire()
        return []
    gpus = sorted({row.index for row in NodeStatus.of(status(session.endpoint)).gpus} | {mine})
    others: list[Any] = []
    try:
        for gpu in gpus:
            if gpu == mine:
                own.acquire()
                continue
            # the other GPUs' jobs frozen; the cores stay as this job's own region sets them
            region = exclusive(gpu=gpu, max_hold=max_hold, isolate=False)
            region.acquire()
            others.append(region)
    except BaseException:
        if own.id is not None:
            with contextlib.suppress(Exception):
                own.release()
        release_all(others)
        raise
    return others


def release_all(regions: list[Any]) -> None:
    """Every one of ``regions`` released, last taken first, whatever one of them raises."""
    for region in reversed(regions):
        with contextlib.suppress(Exception):
            region.release()
