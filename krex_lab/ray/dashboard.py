"""The cluster dashboard: every KREX node of a Ray cluster in one notebook widget.

    import ray, krex_lab.ray as kr
    ray.init(address="auto")
    kr.cluster_dashboard()          # one panel per node-GPU: gate, holder, queue, sessions

Each refresh gathers :func:`~krex_lab.ray.cluster.cluster_status` through Ray (each node actor's
``status()``) in a thread of its own and draws every node with the node dashboard's own panels
(:func:`krex_lab.dashboard.view.page_html` of that node's status), under a line naming the node.
A node without a KREX service, or whose actor did not answer, says so in its place.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cluster import ClusterNode


def cluster_html(nodes: list[ClusterNode], now: float | None = None) -> str:
    """The page of ``nodes`` (what ``cluster_status()`` returns): a header, then each node's panels."""
    from ..dashboard.model import Event, NodeState, reduce
    from ..dashboard.view import page_html

    now = time.time() if now is None else now
    parts = [f"<div><b>Ray cluster: {len(nodes)} node(s) with KREX</b></div>"]
    for n in nodes:
        where = n.address or n.hostname or "?"
        parts.append(f"<div><b>node {html.escape(n.node)}</b> ({html.escape(where)})</div>")
        if n.error or n.arbiter is None:
            why = n.error or n.arbiter_error or "no answer from its arbiter"
            parts.append(f"<div style='color:#a00'>{html.escape(why)}</div>")
            continue
        state = reduce(NodeState(), Event("snapshot", {"status": n.arbiter, "regions": []}, now))
        parts.append(f'<div class="krex-node">{page_html(state, now)}</div>')
    return "".join(parts)


class ClusterDashboard:
    """An ``ipywidgets.HTML`` redrawn every ``refresh`` seconds from ``gather()`` (off the kernel's
    thread: a slow node must not block the notebook); :meth:`close` stops it."""

    def __init__(self, gather: Callable[[], list[ClusterNode]], refresh: float = 2.0) -> None:
        import ipywidgets as widgets

        self.gather = gather
        self.refresh = refresh
        self.nodes: list[ClusterNode] = []
        self.error = ""
        self.widget = widgets.HTML(value="<i>gathering the cluster's KREX nodes ...</i>")
        self._stop = threading.Event()
        self.update()
        self._thread = threading.Thread(target=self._run, name="krex-cluster-dashboard", daemon=True)
        self._thread.start()

    def update(self) -> None:
        try:
            self.nodes, self.error = self.gather(), ""
        except Exception as exc:  # Ray went away: say so, keep the last page
            self.error = f"{type(exc).__name__}: {exc}"
        page = cluster_html(self.nodes)
        if self.error:
            page = f"<div style='color:#a00'>{html.escape(self.error)}</div>{page}"
        self.widget.value = page

    def _run(self) -> None:
        while not self._stop.wait(self.refresh):
            self.update()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(self.refresh + 5)
        self.widget.close()

    def summary(self) -> str:
        from .status import format_cluster

        return (f"(last refresh failed: {self.error})\n" if self.error else "") + format_cluster(self.nodes)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def __repr__(self) -> str:  # what text frontends show instead of the widget
        return self.summary()


def cluster_dashboard(refresh: float = 2.0, resource: str | None = None) -> ClusterDashboard:
    """A live view of every KREX node of the Ray cluster this process is connected to."""
    from .cluster import cluster_status

    return ClusterDashboard(lambda: cluster_status(resource=resource), refresh)
