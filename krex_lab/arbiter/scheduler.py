"""Region queues and the region sequence: queue, gate, drain, freeze, isolate, grant, release.

One FIFO queue per GPU. The head of a queue is granted when its GPU is free; the enforcement
steps run in the order of the design (lock before freeze, freeze before isolate) and are
undone in reverse at release, which happens when the holder asks, when its process dies,
or when the lease (``max_hold``) runs out. Everything done to another process is journaled
first (:mod:`krex_lab.arbiter.journal`).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..enforcement.freeze import thaw
from ..errors import KrexError, RegionCancelled
from ..procfiles import KEPT
from ..procutil import ancestors, node_task_count, task_count, tree_until
from ..protocol import Granted, RegionSpec
from ..region_report import RegionReport
from .draining import Draining
from .enforcement import Enforcement, end_linger_named, isolate, unisolate
from .intruders import Intruders
from .kin_looks import KinLooks
from .region import BackendInfo, Region, RegionState, Reply
from .scheduler_config import Notifier, SchedulerConfig
from .sessions import Session, SessionTable

log = logging.getLogger("krex.scheduler")

#: up to this many threads, isolation runs on the event loop (cheaper than a thread hand-off)
INLINE_THREADS = 256

#: how long the grant looks again at once (yielding to the loop, no timed pause) for stops
#: that have not landed yet, before it pauses between looks
SPIN_LANDING = 0.01


class QueuePolicy(Protocol):
    """Which queued region of a GPU goes next, and what a finished region costs its user."""

    def pick(self, queue: collections.deque[Region]) -> Region: ...

    def charge(self, uid: int, seconds: float, cost: float = 0.0, user: str = "") -> None: ...


class Fifo:
    """First come, first served."""

    def pick(self, queue: collections.deque[Region]) -> Region:
        return queue[0]

    def charge(self, uid: int, seconds: float, cost: float = 0.0, user: str = "") -> None:
        pass


class Scheduler:
    """One FIFO queue per GPU and the region sequence. Called by the arbiter's request handlers
    (:meth:`request`, :meth:`release`, :meth:`session_gone`, :meth:`intruder_session`) and at
    shutdown; everything runs on the arbiter's event loop."""

    def __init__(
        self,
        gpus: int,
        sessions: SessionTable,
        steps: Enforcement,
        notify: Notifier,
        config: SchedulerConfig,
        policy: QueuePolicy | None = None,
        on_finish: Callable[[RegionReport], None] | None = None,
    ) -> None:
        self.sessions = sessions
        #: called (on the loop, must not block) with each finished region's report: the history
        #: database and the metrics (``Arbiter._region_finished``)
        self.on_finish = on_finish
        self.policy: QueuePolicy = policy or Fifo()
        self.steps = steps
        self.notify = notify
        self.config = config
        self.backend_info = BackendInfo.of(config.backend_info)
        self.queues: dict[int, collections.deque[Region]] = {g: collections.deque() for g in range(gpus)}
        self.active: dict[int, Region | None] = dict.fromkeys(range(gpus))
        self.history: collections.deque[RegionReport] = collections.deque(maxlen=config.history)
        self._ids = itertools.count(1)
        #: the region ids of this arbiter start after this number (:meth:`number_after`)
        self.first_id = 1
        self._tasks: set[asyncio.Future[Any]] = set()
        # Per-thread work (affinities of every thread of every session) runs here, off the loop;
        # one thread, so that the core book is only ever touched by one at a time.
        self._threads = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="krex-isolate")
        #: a lingering shield being ended (see enforcement.py): a grant waits for its cores
        self._ending_linger: asyncio.Future[Any] | None = None
        #: a thawed region's frozen ancestors, looked at again
        self.kin_looks = KinLooks()
        self.draining = Draining(steps, sessions, notify, config, self._other_session_pids, self._frozen_elsewhere)
        self.intruders = Intruders(steps, notify, config, self._other_session_pids, self._spawn)

    def _spawn(self, coro: Any) -> asyncio.Future[Any]:
        # Keep a reference: the loop holds tasks only weakly.
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- requests -------------------------------------------------------------------------
    def number_after(self, last: int) -> None:
        """Number this arbiter's regions after ``last`` (the history's highest id): ids a user
        types (``krex history``, the admin page) never repeat across restarts."""
        self.first_id = last + 1
        self._ids = itertools.count(self.first_id)

    def request(self, session: Session, spec: RegionSpec, reply: Reply) -> Region:
        """Queue a region as ``spec`` says (its GPU, lease and cores filled in by the caller)."""
        gpu = session.gpu if spec.gpu is None else spec.gpu
        region = Region(id=f"r{next(self._ids)}", gpu=gpu, session=session, spec=spec, reply=reply)
        self.queues[gpu].append(region)
        self.notify.publish(
            "region",
            {
                "event": "requested",
                "region": region.id,
                "gpu": gpu,
                "session": session.id,
                "queue": len(self.queues[gpu]),
            },
        )
        self.intruders.requested(session, region)
        self._kick(gpu)
        self.intruders.queued(session)
        return region

    def holder(self, gpu: int) -> Region | None:
        """The region that holds (or is being granted) ``gpu``, if any."""
        return self.active.get(gpu)

    def regions_of(self, session: Session, gpu: int) -> list[Region]:
        """``session``'s regions on ``gpu``: the one it holds and those it waits for."""
        return [r for r in [self.active.get(gpu), *self.queues[gpu]] if r is not None and r.session.id == session.id]

    def waiting(self) -> list[Region]:
        """Every queued region, on every GPU."""
        return [r for q in self.queues.values() for r in q]

    def find(self, region_id: str) -> Region | None:
        for gpu, active in self.active.items():
            if active and active.id == region_id:
                return active
            for queued in self.queues[gpu]:
                if queued.id == region_id:
                    return queued
        return None

    def past(self, region_id: str) -> RegionReport | None:
        return next((r for r in reversed(self.history) if r.region == region_id), None)

    async def release(self, region: Region, reason: str) -> RegionReport:
        """Release a held region or withdraw a queued one; returns its final report."""
        if region.state is RegionState.QUEUED:
            self.queues[region.gpu].remove(region)
            region.move(RegionState.RELEASED)
            region.released_by = reason
            region.reply(None, RegionCancelled(f"region {region.id} was withdrawn before its grant ({reason})"))
            report = self._finish_report(region)
            self.notify.publish("region", {"event": "withdrawn", **report.to_dict()})
            return report
        if region.state is RegionState.GRANTING:
            region.release_wanted = reason
            await region.done.wait()
            return self.past(region.id) or RegionReport()
        if region.state is RegionState.HELD:
            await self._undo(region, reason)
        else:
            await region.done.wait()
        return self.past(region.id) or RegionReport()

    def session_gone(self, session: Session, reason: str) -> None:
        KEPT.forget(session.pid)  # the /proc files kept for its tree walks
        self.intruders.gone(session)
        for gpu in self.queues:
            for region in [r for r in self.queues[gpu] if r.session.id == session.id]:
                self._spawn(self.release(region, reason))
            active = self.active[gpu]
            if active and active.session.id == session.id:
                self._spawn(self.release(active, reason))
            if active:
                ack = active.acks.pop(session.id, None)
                if ack and not ack.done():
                    ack.set_exception(KrexError("session ended"))

    # -- the sequence -----------------------------------------------------------------------
    def _kick(self, gpu: int) -> None:
        if self.active[gpu] is None and self.queues[gpu]:
            region = self.policy.pick(self.queues[gpu])
            self.queues[gpu].remove(region)
            self.active[gpu] = region
            region.move(RegionState.GRANTING)
            self._spawn(self._grant(region))

    async def _grant(self, region: Region) -> None:
        t0 = time.monotonic()
        region.times["wait"] = t0 - region.requested
        holder = region.session
        # The holder's ancestors and its own process tree, where the tree stops at processes
        # that are sessions of their own (a kernel started from a notebook, a pool on demand),
        # except those that registered as part of this very region (KREX_REGION).
        apart = self._other_session_pids(region)
        own = set(tree_until(holder.pid, apart)) | self.steps.own_pids()
        # Drained is everyone's GPU work but the holder's own: its ancestors' and an exempt
        # client's too (a client waiting for a job's output, or a pool's parent, may hold a
        # context with work queued: a lock only blocks their next GPU call).
        region.drain_exempt = own
        # Never stopped: the holder, its ancestors, and the clients it named (each process
        # itself, not its other descendants: a client's other children are drained and frozen).
        region.exempt = own | set(ancestors(holder.pid)) | set(region.spec.exempt)
        try:
            self.steps.gate.close(region.gpu, region.id, holder.pid)
            siblings = [s for s in self.sessions.on_gpu(region.gpu) if s.id != holder.id and s.pid not in region.exempt]
            await self.draining.drain(region, siblings)
            t1 = time.monotonic()
            region.times["drain"] = t1 - t0
            # A session that left while being drained is no session to freeze any more.
            siblings = [s for s in siblings if s.pid not in region.gone]
            if region.freeze:
                # Sessions that acknowledged the drain may already be stopped (see _drain).
                self.steps.freezer.freeze(region.id, [s.pid for s in siblings], region.exempt, result=region.frozen)
                # Grant only once the stops have landed: a sibling still running would share
                # the holder's first milliseconds. (Re-walking the trees waits till after.)
                # Looked at at once: stops made at the drain's answers have landed by now. Then
                # the loop only yields between looks (one stat read each) for SPIN_LANDING
                # seconds: a timed pause costs a millisecond (epoll's resolution), and stops
                # land within tens of microseconds of each other.
                looked_at = len(region.frozen.procs), len(region.frozen.cgroups)
                waiting = self.steps.freezer.pending(region.frozen)
                while waiting and time.monotonic() - t1 < 0.1:
                    await asyncio.sleep(0 if time.monotonic() - t1 < SPIN_LANDING else 0.0002)
                    waiting = self.steps.freezer.pending(region.frozen, among=waiting)
                if not waiting:  # the settle looks only at stops made after these
                    region.frozen.seen_landed(*looked_at)
            t2 = time.monotonic()
            region.times["freeze"] = t2 - t1
            if region.isolate and region.cores > 0:  # cores=0: the holder asked for no isolation
                if self._ending_linger is not None and not self._ending_linger.done():
                    # Its cores are still reserved until it has restored everyone (on a 2-core
                    # machine they are the only ones to have).
                    await asyncio.shield(self._ending_linger)
                roots = [s.pid for s in self.sessions if s.pid not in region.exempt]
                deadline = time.monotonic() + self.config.isolate_deadline
                others = self._other_session_pids(region)  # as they are now, after the drain's wait
                if self._few_threads(self.steps.shield.mode, lambda: task_count([holder.pid, *roots])):
                    # A handful of threads: a thread hand-off would cost more than the work.
                    region.isolated = isolate(self.steps, region, roots, others, deadline)
                else:
                    region.isolated = await asyncio.get_running_loop().run_in_executor(
                        self._threads, isolate, self.steps, region, roots, others, deadline
                    )
            region.times["isolate"] = time.monotonic() - t2
            region.times["acquire"] = time.monotonic() - t0
        except Exception as exc:  # never leave a half-enforced region behind
            log.exception("region %s failed during enforcement", region.id)
            await self._undo(region, f"enforcement failed: {exc}")
            region.reply(None, KrexError(f"enforcement failed and was undone: {exc}"))
            return
        if region.release_wanted:  # the holder left (or withdrew) while it was being granted
            await self._undo(region, region.release_wanted)
            region.reply(
                None, RegionCancelled(f"region {region.id} was withdrawn during its grant ({region.release_wanted})")
            )
            return
        region.move(RegionState.HELD)
        region.granted_at = time.monotonic()
        region.lease = asyncio.get_running_loop().call_later(region.max_hold, self._expire, region)
        if region.frozen.procs:
            self._spawn(self._settle_freeze(region, [s.pid for s in siblings]))
        if self.steps.locker.can_lock:
            region.watcher = self._spawn(self.draining.watch_intruders(region))
        report = region.report(self.backend_info)
        self.notify.publish("region", {"event": "granted", **report.to_dict()})
        region.reply(Granted(region=region.id, gpu=region.gpu, report=report), None)

    @staticmethod
    def _few_threads(mode: str, session_threads: Callable[[], int]) -> bool:
        """Whether a shield's thread work is small enough to do on the event loop: a thread
        hand-off costs more than a few hundred affinity calls. ``sessions`` mode touches the
        sessions' threads, ``affinity`` every thread of the node; ``cpuset`` waits on the kernel."""
        if mode == "sessions":
            return session_threads() <= INLINE_THREADS
        return mode == "affinity" and node_task_count() <= INLINE_THREADS

    async def _settle_freeze(self, region: Region, roots: list[int]) -> None:
        """Walk the frozen trees again for children forked while the stops were in flight. A walk
        that starts once every stop has landed sees trees that can no longer grow: if it finds
        nothing new, the freeze is complete. A stop still in flight (a process in D state, slow on
        a loaded machine) does not hold the walks back: its siblings may be forking."""
        began = time.monotonic()
        deadline = began + 2.0
        waiting: list[str] | None = None  # None: check every stop (new ones were just sent)
        while region.state is RegionState.HELD and time.monotonic() < deadline:
            waiting = self.steps.freezer.pending(region.frozen, among=waiting)
            landed = not waiting
            late = self.steps.freezer.settle(region.id, region.frozen, roots, region.exempt)
            if late:
                region.drain.intruders.extend(late)
                waiting = None
            elif landed:
                region.frozen.landed()
                region.times["settle"] = time.monotonic() - began  # after the grant, with the holder
                return
            await asyncio.sleep(0.002)

    def intruder_session(self, session: Session) -> None:
        """A session that registers on a GPU mid-region is drained and frozen (lock first)."""
        self.intruders.registered(session, self.active.get(session.gpu))

    def _other_session_pids(self, region: Region) -> set[int]:
        return {s.pid for s in self.sessions if s.id != region.session.id and s.within != region.id}

    def _frozen_elsewhere(self, region: Region) -> set[int]:
        """The processes the regions on the other GPUs hold frozen (stopped or in a frozen cgroup)."""
        return {p for r in self.active.values() if r is not None and r is not region for p in r.frozen.all_pids()}

    def _expire(self, region: Region) -> None:
        if region.state is not RegionState.HELD:
            return
        log.warning("region %s on GPU %d reached max_hold %.1f s: releasing", region.id, region.gpu, region.max_hold)
        self.notify.control(region.session, "lease_expired", region)
        self._spawn(self.release(region, "lease expired"))

    async def _undo(self, region: Region, reason: str) -> None:
        region.move(RegionState.RELEASING)
        region.released_by = reason
        if region.lease:
            region.lease.cancel()
        if region.watcher:
            # A watcher inside lock_all must finish: the locks it is making have to be undone.
            while region.locking:
                await asyncio.sleep(0.005)
            region.watcher.cancel()
        times = region.times
        t0 = time.monotonic()
        try:
            # One step after the other: giving the cores back after the thaw, beside the unlocks,
            # took 3.7 ms instead of 1.3 with 15 siblings on the H200 (gVisor; 2026-12-02,
            # arbiter_latency ...T0648 against ...before-seqrel-3a859a5...): /proc walks beside
            # 270 threads waking up. Unlock after the thaw: the driver's helper in each answers.
            # Inline only for a few threads: the node-wide shield walks every process again at
            # release (what was born during the region), a partition waits on the kernel.
            if self._few_threads(region.shielded.mode, lambda: self.steps.cores.touched(region.id)):
                linger = unisolate(self.steps, region)
            else:
                linger = await asyncio.get_running_loop().run_in_executor(self._threads, unisolate, self.steps, region)
            if linger is not None:
                asyncio.get_running_loop().call_later(self.steps.linger, self._linger_over, linger.name)
            t1 = time.monotonic()
            times["unisolate"] = t1 - t0
            thaw(region.frozen)
            if region.frozen.kin:  # a parent whose own stop landed after the thaw: look again
                self.kin_looks.look(0, region.frozen.kin, region.frozen.kin_first, region.frozen.kin_looked)
            t2 = time.monotonic()
            times["thaw"] = t2 - t1
            region.drain.closed = True
            if region.drain.locked or region.drain.late:
                await region.timed("unlock", self._unlock(region))
            for s in self.sessions.on_gpu(region.gpu):
                if s.pid in region.drain.acked or s.pid in region.drain.intruders:
                    self.notify.control(s, "resume", region)
        finally:
            self.steps.journal.end(region.id)
            self.steps.gate.open(region.gpu)
            times["undo"] = time.monotonic() - t0
            region.move(RegionState.RELEASED)
            if region.granted_at:
                region.times["hold"] = time.monotonic() - region.granted_at
            # What the region cost the others beyond its hold: its grant's steps and its release.
            cost = region.times.get("acquire", 0.0) + region.times["undo"]
            self.policy.charge(region.session.uid, region.times.get("hold", 0.0), cost, region.session.user)
            report = self._finish_report(region)
            self.notify.publish("region", {"event": "released", **report.to_dict()})
            self.active[region.gpu] = None
            region.done.set()
            self._kick(region.gpu)

    def _linger_over(self, name: str) -> None:
        """A lingering shield's time is up: give its cores back, unless a region adopted it. Taken
        in the isolation thread, after any grant's isolation queued there before (which may adopt
        it); a grant that isolates on the loop waits for this first (see _grant)."""
        self._ending_linger = self._spawn(self._end_linger(name))

    async def _end_linger(self, name: str | None) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self._threads, end_linger_named, self.steps, name)
        except Exception:  # the journal keeps it: the next arbiter or the guardian undoes it
            log.exception("ending the lingering shield %s failed", name)

    async def _unlock(self, region: Region) -> None:
        errors = await self.steps.locker.unlock_all(region.drain.locked + region.drain.late)
        region.isolated.failed.extend(errors)

    def _finish_report(self, region: Region) -> RegionReport:
        report = region.report(self.backend_info)
        # Wall-clock times (epoch seconds) for the history that outlives this process.
        now, mono = time.time(), time.monotonic()
        report.requested_at = round(now - (mono - region.requested), 6)
        if region.granted_at:
            report.granted_at = round(now - (mono - region.granted_at), 6)
        report.released_at = round(now, 6)
        self.history.append(report)
        if self.on_finish is not None:
            try:
                self.on_finish(report)
            except Exception:  # recording a region never breaks the region sequence
                log.exception("recording the end of region %s failed", region.id)
        return report

    async def shutdown(self) -> None:
        for gpu in self.queues:
            for region in list(self.queues[gpu]):
                await self.release(region, "arbiter shutting down")
            active = self.active[gpu]
            if active is not None:
                await self.release(active, "arbiter shutting down")
        if self._ending_linger is not None:
            await self._ending_linger
        await self._end_linger(None)  # whichever lingers still
        if self.steps.watch is not None:
            self.steps.watch.close()
