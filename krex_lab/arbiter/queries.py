"""What the arbiter answers about the node: status, recent regions, the region history, each
as the asking user may see it (:mod:`.privacy`). Called by the arbiter's
:class:`~krex_lab.rpc_server.Service` on the event loop; the history is read in a thread.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .. import protocol
from ..errors import InvalidRequest, KrexError, RequestRejected
from ..node_status import NodeStatus
from ..rpc_server import Handler, Peer
from .history import USAGE_KEYS, Recent, RecentView, RegionHistory, Usage, usage_of
from .identity import Tickets
from .privacy import report_view, status_view
from .quotas import Quotas
from .scheduler import Scheduler

HISTORY_LIMIT = 5000
#: the usage window of a ``history --usage`` request that names no start
USAGE_DEFAULT_S = 7 * 86400.0


class NodeQueries:
    """Handlers of Status, Regions and History requests."""

    def __init__(
        self,
        table: Callable[[], object],
        scheduler: Scheduler,
        tickets: Tickets,
        quotas: Quotas,
        history_db: Callable[[], tuple[RegionHistory | None, str]],
        multi_user: bool,
        privacy: str,
    ) -> None:
        #: the node table in full (``Arbiter.status``: a NodeStatus or its JSON form)
        self.table = table
        self.scheduler = scheduler
        self.tickets = tickets
        self.quotas = quotas
        #: the history database and, when there is none, why
        self.history_db = history_db
        self.multi_user = multi_user
        self.privacy = privacy

    def handlers(self) -> dict[type, Handler]:
        """The service's handler of each request these answer."""
        return {protocol.Status: self.status, protocol.Regions: self.regions, protocol.History: self.history}

    def viewer(self, ticket: str) -> int | None:
        """The uid a status or regions request shows in full (None: anonymous); -1: everything."""
        viewer = self.tickets.redeem(ticket).uid if ticket else None
        # A single-user arbiter's socket is its owner's alone: there is no one to hide from.
        if not self.multi_user or self.privacy == "open" or (viewer is not None and self.quotas.is_admin(viewer)):
            return -1
        return viewer

    def status(self, req: protocol.Status, peer: Peer) -> NodeStatus:
        viewer = self.viewer(req.ticket)
        table = NodeStatus.of(self.table())
        return table if viewer == -1 else status_view(table, viewer)

    def regions(self, req: protocol.Regions, peer: Peer) -> list[dict[str, Any]]:
        viewer = self.viewer(req.ticket)
        recent = list(self.scheduler.history)[-max(0, req.limit) :]
        return [r.to_dict() if viewer == -1 else report_view(r, viewer) for r in recent]

    def history(self, req: protocol.History, peer: Peer) -> Awaitable[RecentView | Usage]:
        viewer = self.viewer(req.ticket)
        db, why = self.history_db()
        if db is None:  # the arbiter's setting, not the request's values: refused, not invalid
            raise RequestRejected(why)
        user = req.user or None
        if req.by and req.by not in USAGE_KEYS:
            raise InvalidRequest(f"usage by {req.by!r}: one of {', '.join(USAGE_KEYS)}")

        def query() -> Recent | Usage:
            db.flush(1.0)  # what finished before this request is in the answer
            if not req.usage:
                limit = min(max(0, req.limit), HISTORY_LIMIT)
                return Recent(db.recent(limit, user, req.since, slurm_job=req.slurm_job or None))
            until = time.time() if req.until is None else req.until
            since = until - USAGE_DEFAULT_S if req.since is None else req.since
            return usage_of(db, since, until, user, req.by)

        async def answer() -> RecentView | Usage:
            try:
                result = await asyncio.get_running_loop().run_in_executor(None, query)
            except (sqlite3.Error, RuntimeError) as exc:
                raise KrexError(f"reading the region history failed: {exc}") from None
            if isinstance(result, Recent):
                # Others' regions as who and how much; usage totals (names and hours) are public.
                return RecentView([r.to_dict() if viewer == -1 else report_view(r, viewer) for r in result.rows])
            return result

        return answer()
