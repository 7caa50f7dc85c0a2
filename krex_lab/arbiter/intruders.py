"""Sessions that register on a GPU while another session's region holds it.

Such a session is drained and frozen (lock first) once it has heard its registration, or at once
when it queues first. One stopped on its way to queueing has its request's report say how long
that stop was. The :class:`~.scheduler.Scheduler` owns one :class:`Intruders` and calls it on its
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from ..errors import KrexError
from ..procutil import tree
from .enforcement import Enforcement
from .region import Region, RegionState
from .scheduler_config import Notifier, SchedulerConfig
from .sessions import Session

#: a request that arrives within this many seconds of the end of its session's stop as an
#: intruder was on its way when it was stopped: its report says how long that stop was
STOPPED_WINDOW = 1.0


class Intruders:
    """The intruders of the regions on the enforcement steps they use."""

    def __init__(
        self,
        steps: Enforcement,
        notify: Notifier,
        config: SchedulerConfig,
        other_sessions: Callable[[Region], set[int]],
        spawn: Callable[[Any], asyncio.Future[Any]],
    ) -> None:
        self.steps = steps
        self.notify = notify
        self.config = config
        #: pids of the sessions that are not part of a region (see Scheduler._other_session_pids)
        self._other_sessions = other_sessions
        #: runs a coroutine as a task the scheduler keeps (Scheduler._spawn)
        self._spawn = spawn
        self._pending: dict[str, tuple[Region, asyncio.TimerHandle]] = {}
        #: sessions stopped as intruders before they queued: when, and by which region
        self._stopped: dict[str, tuple[float, Region]] = {}

    def registered(self, session: Session, region: Region | None) -> None:
        """``session`` registered on the GPU that ``region`` (if any) holds."""
        if region is None or region.state is not RegionState.HELD:
            return
        if session.within == region.id or region.exempts(session.pid, self._other_sessions(region)):
            return
        region.drain.intruders.append(session.pid)
        # Let it hear its registration and queue first (queued() then stops it at once).
        handle = asyncio.get_running_loop().call_later(self.config.intruder_grace, self._start, region, session)
        self._pending[session.id] = (region, handle)

    def requested(self, session: Session, region: Region) -> None:
        """``session`` asked for ``region``: say how long it was stopped on its way, if it was."""
        stopped = self._stopped.pop(session.id, None)
        if stopped is not None:
            # Stopped as an intruder on its way here (between registering and queueing): the
            # caller waited that long too, though this queue only saw it now.
            since, by = stopped
            until = by.granted_at + by.times.get("hold", 0.0) if by.state is RegionState.RELEASED else region.requested
            if region.requested - until <= STOPPED_WINDOW:
                region.times["stopped_before_request"] = until - since

    def queued(self, session: Session) -> None:
        """``session``'s request is queued: an intruder waiting for its grace is stopped now."""
        pending = self._pending.pop(session.id, None)
        if pending is not None:  # it registered mid-region and has now queued: stop it now
            pending[1].cancel()
            self._start(pending[0], session, queued=True)

    def gone(self, session: Session) -> None:
        self._stopped.pop(session.id, None)
        pending = self._pending.pop(session.id, None)
        if pending is not None:
            pending[1].cancel()

    def _start(self, region: Region, session: Session, queued: bool = False) -> None:
        self._pending.pop(session.id, None)
        if region.state is RegionState.HELD:
            if region.freeze and not queued:  # stopped before it could queue (see queued())
                self._stopped[session.id] = (time.monotonic(), region)
            self._spawn(self._intrude(region, session))

    async def _intrude(self, region: Region, session: Session) -> None:
        if self.steps.locker.can_lock:
            region.locking = True
            try:
                await self.steps.locker.lock_all(tree(session.pid), region.drain, self.steps.lock_journal(region.id))
            finally:
                region.locking = False
        elif session.control is not None:
            # As in the grant's drain: it synchronises, answers (and says why it waits), and is
            # frozen only then, or after drain_timeout if it does not answer.
            ack = region.acks[session.id] = asyncio.get_running_loop().create_future()
            self.notify.control(session, "drain", region)
            with contextlib.suppress(asyncio.TimeoutError, KrexError):
                await asyncio.wait_for(asyncio.shield(ack), self.config.drain_timeout)
            if ack.done() and not ack.cancelled() and ack.exception() is None:
                region.drain.acked.append(session.pid)
        if region.freeze and region.state is RegionState.HELD:
            self.steps.freezer.extend(region.id, region.frozen, [session.pid], region.exempt)
