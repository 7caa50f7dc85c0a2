"""Step 3 of a region as the scheduler runs it: drain the GPU's other work, and keep it drained.

:class:`Draining` is called by the :class:`~.scheduler.Scheduler` on its event loop: ``drain``
during a grant (driver locks through the ``Locker``, ``drain`` control messages to the other
KREX-aware sessions, and what was neither named in the report), ``watch_intruders`` while a
region is held (processes that appear on the GPU are locked).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from ..enforcement.lock_frozen import resume_stopped, still_stopped, stop_again, stopped_here
from ..procutil import STOPPED, exited_or_exiting, proc_state, state_and_start, tree
from .enforcement import Enforcement
from .region import Region, RegionState
from .scheduler_config import Notifier, SchedulerConfig
from .sessions import Session, SessionTable

log = logging.getLogger("krex.scheduler")


def _running(session: Session) -> bool:
    """Is the session's process still there (not exited, not a zombie, not a reused pid)?"""
    state, start = state_and_start(session.pid)
    return state not in (None, "Z", "X") and start == session.start


class Draining:
    """The drain of a region on the enforcement steps it uses; the scheduler owns one."""

    def __init__(
        self,
        steps: Enforcement,
        sessions: SessionTable,
        notify: Notifier,
        config: SchedulerConfig,
        other_sessions: Callable[[Region], set[int]],
        frozen_elsewhere: Callable[[Region], set[int]] = lambda region: set(),
    ) -> None:
        self.steps = steps
        self.sessions = sessions
        self.notify = notify
        self.config = config
        #: pids of the sessions that are not part of a region (see Scheduler._other_session_pids)
        self._other_sessions = other_sessions
        #: pids the other regions hold frozen (SIGSTOP or a frozen cgroup, whose tasks show state S)
        self._frozen_elsewhere = frozen_elsewhere

    async def drain(self, region: Region, siblings: list[Session]) -> None:
        """Lock what the driver can lock; ask the other KREX-aware sessions to synchronise.

        A session that is being locked is not also asked to synchronise: its sync call would
        block on the very lock until release.
        """
        loop = asyncio.get_running_loop()
        targets: set[int] = set()
        lock_job = None
        t0 = time.monotonic()
        listed = {p.pid for p in self.steps.gpu_processes(region.gpu)} - region.drain_exempt
        region.times["drain_list"] = time.monotonic() - t0
        if self.steps.locker.can_lock:
            targets = set(listed)
            if not self.config.lock_foreign:
                targets &= {p for s in self.sessions for p in tree(s.pid)}
            lock_job = region.timed(
                "drain_lock",
                self.steps.locker.lock_all(sorted(targets), region.drain, self.steps.lock_journal(region.id)),
            )
        cooperative = [s for s in siblings if s.control is not None and s.pid not in targets]
        # A session whose process is stopped (another region's freeze, a user's Ctrl-Z, a
        # debugger) can neither answer nor submit GPU work: it is not asked, and the freeze
        # leaves it as it found it (skipped_stopped) instead of the drain waiting out its timeout.
        stopped = self._stopped(region, cooperative)
        cooperative = [s for s in cooperative if s.pid not in stopped]
        # Without driver locks nothing can be stopped before it is locked, so a session is
        # frozen the moment it has synchronised: drain and freeze overlap instead of adding up.
        freeze_on_ack = region.freeze and not self.steps.locker.can_lock
        # The sessions still to answer: an answer's freeze walks the answering session's whole
        # tree, and must not stop a session of its own inside it (a loop a notebook started)
        # before that one has answered too (it is frozen at its own answer, or after the wait).
        unanswered: dict[str, int] = {s.id: s.pid for s in cooperative}
        for s in cooperative:
            ack = region.acks[s.id] = loop.create_future()
            if freeze_on_ack:
                ack.add_done_callback(functools.partial(self._freeze_acked, region, s.pid, unanswered))
            ack.add_done_callback(functools.partial(lambda sid, _: unanswered.pop(sid, None), s.id))
            self.notify.control(s, "drain", region)
        for s in siblings:
            if s.control is None and s.pid not in targets:
                region.drain.not_drained[s.pid] = "not KREX-aware (no control channel) and not lockable"
        waits: list[Any] = []
        # Futures kept here too: a session that ends meanwhile takes its own out of region.acks.
        acks = dict(region.acks)
        asked = time.monotonic()
        # A silent session is asked too (its answer clears it) but not waited for.
        awaited = [acks[s.id] for s in cooperative if s.id in acks and not s.silent]
        if awaited:
            waits.append(asyncio.wait(awaited, timeout=self.config.drain_timeout))
        if lock_job is not None:
            waits.append(lock_job)
        await asyncio.gather(*waits)
        # What was measured: the wait ends early when every ack arrived or a session left.
        waited = time.monotonic() - asked
        live = {s.id for s in self.sessions}
        # A session whose process is inside exit() has nothing left to drain (no grace here: a
        # silent session is already past the drain timeout, and a living one would pay it again).
        ending = {s.pid for s in cooperative if s.id not in acks or not acks[s.id].done()}
        ending = {pid for pid in ending if exited_or_exiting(pid)}
        for s in cooperative:
            fut = acks.get(s.id)
            if fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None:
                region.drain.acked.append(s.pid)
            elif s.id not in live or not _running(s) or s.pid in ending:
                # It exited, or ended its session, while being drained: nothing left to drain.
                region.gone.append(s.pid)
            elif s.silent:
                region.drain.not_drained[s.pid] = (
                    "silent: missed an earlier drain and has not answered one since (not waited for)"
                )
            else:
                region.drain.not_drained[s.pid] = f"did not answer drain within {waited:.2f} s"
                s.silent = True
                log.warning(
                    "session %s (pid %d, %s) did not answer a drain: not waited for until it answers one",
                    s.id,
                    s.pid,
                    s.user,
                )
            if fut is not None and not fut.done():
                fut.cancel()
        # Whatever is on the GPU and neither locked, synchronised nor known to need no lock
        # shares the region: name it, saying why it was not drained (the report is then degraded).
        done = set(region.drain.acked) | set(region.drain.locked_pids) | set(region.drain.unlocked_ok)
        for pid in sorted(listed - done - set(region.drain.not_drained) - set(region.gone)):
            if exited_or_exiting(pid):  # ended since the GPU was listed (a zombie is listed too)
                region.gone.append(pid)
            elif not self.steps.locker.can_lock:
                region.drain.not_drained[pid] = (
                    f"on the GPU and not drained: the {self.steps.backend_name} backend cannot lock it"
                )
            elif pid not in targets:
                region.drain.not_drained[pid] = (
                    "on the GPU and not locked: not a KREX session's process (lock_foreign is off)"
                )
            else:
                region.drain.not_drained[pid] = "on the GPU and not locked: the lock was not attempted"

    def _freeze_acked(self, region: Region, pid: int, unanswered: dict[str, int], fut: asyncio.Future[None]) -> None:
        if not fut.cancelled() and fut.exception() is None and region.state is RegionState.GRANTING:
            waiting = {p for p in unanswered.values() if p != pid}
            self.steps.freezer.extend(region.id, region.frozen, [pid], region.exempt | waiting, passes=1)

    def _stopped(self, region: Region, sessions: list[Session]) -> set[int]:
        """The pids of ``sessions`` that are stopped now, noted as skipped by the freeze with
        those of their descendants another region holds frozen (a frozen cgroup's tasks show
        state S: stopping them again would only wait for stops that cannot land)."""
        elsewhere: set[int] | None = None
        stopped: set[int] = set()
        for s in sessions:
            state = proc_state(s.pid, kept=True)
            if state not in STOPPED:
                if elsewhere is None:
                    elsewhere = self._frozen_elsewhere(region)
                if s.pid not in elsewhere:
                    continue
            stopped.add(s.pid)
        if stopped:
            elsewhere = self._frozen_elsewhere(region) if elsewhere is None else elsewhere
            skipped = region.frozen.skipped
            for pid in stopped:
                skipped.extend(p for p in tree(pid) if (p == pid or p in elsewhere) and p not in skipped)
            log.info("region %s: sessions %s are stopped: not asked to drain", region.id, sorted(stopped))
        return stopped

    async def _lock_stopped_here(self, region: Region, pids: dict[int, int]) -> None:
        """Lock processes this region stopped itself before their context showed on the GPU.

        A sibling's tree is stopped whole, and a process in it may be making its first context
        just then (an evaluation's spare makes its own while idle): it shows on the GPU's list
        only while the region holds. Stopped, it cannot be locked (the driver hangs on it), yet
        it may have queued work before its stop: so it is continued, locked (its queued work
        drains) and stopped again, with whatever it started while it ran. Called with
        ``region.locking`` set: a release waits, so the thaw and the unlock still come after."""
        resume_stopped(region.frozen, pids)
        deadline = time.monotonic() + 0.1
        while still_stopped(pids) and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        try:
            await self.steps.locker.lock_all(sorted(pids), region.drain, self.steps.lock_journal(region.id))
        finally:
            stop_again(region.frozen, pids)
            # what they started while they ran: their trees walked again (no kin of theirs kept:
            # they are no session roots, and their ancestors are this region's frozen sibling)
            region.frozen.roots.update(pids)
            self.steps.freezer.extend(region.id, region.frozen, sorted(pids), region.exempt)

    async def watch_intruders(self, region: Region) -> None:
        """Lock processes that appear on the GPU while the region is held."""
        loop = asyncio.get_running_loop()
        while region.state is RegionState.HELD:
            await asyncio.sleep(self.config.poll_interval)
            try:
                listed = await loop.run_in_executor(None, self.steps.gpu_processes, region.gpu)
            except Exception as exc:  # NVML hiccup: say so, keep watching
                region.watch_errors.append(str(exc))
                log.warning("region %s: listing GPU %d processes failed: %s", region.id, region.gpu, exc)
                continue
            known = set(region.drain.locked_pids) | set(region.drain.not_drained) | {p for p, _ in region.drain.late}
            known |= {p for p, why in region.drain.unlocked_ok.items() if why != "not-cuda"}
            sessions = self._other_sessions(region)
            new = [p.pid for p in listed if p.pid not in known and not region.exempts(p.pid, sessions)]
            if new and region.state is RegionState.HELD:
                region.locking = True
                try:
                    ours = stopped_here(region.frozen, new)
                    if ours:
                        await self._lock_stopped_here(region, ours)
                    rest = [p for p in new if p not in ours]
                    if rest:
                        await self.steps.locker.lock_all(rest, region.drain, self.steps.lock_journal(region.id))
                finally:
                    region.locking = False
                fresh = [p for p in new if p in region.drain.locked_pids and p not in region.drain.intruders]
                if fresh:
                    region.drain.intruders.extend(fresh)
                    self.notify.publish("region", {"event": "intruder", "region": region.id, "pids": fresh})
