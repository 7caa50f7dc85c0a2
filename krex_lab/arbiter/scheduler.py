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
import functools
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import KrexError, RegionCancelled
from ..procutil import ancestors, tree, tree_until
from ..regions.drain import DrainResult
from ..regions.freeze import FreezeResult, thaw
from ..regions.isolate import IsolateResult
from .sessions import Session

if TYPE_CHECKING:
    from .server import Arbiter

log = logging.getLogger("krex.scheduler")

Reply = Callable[[Any, "KrexError | None"], None]


@dataclass
class Region:
    id: str
    gpu: int
    session: Session
    max_hold: float
    freeze: bool
    isolate: bool
    cores: int
    reply: Reply
    requested: float = field(default_factory=time.monotonic)
    state: str = "queued"  # queued -> granting -> held -> released
    granted_at: float = 0.0
    released_by: str = ""
    drain: DrainResult = field(default_factory=DrainResult)
    frozen: FreezeResult = field(default_factory=FreezeResult)
    isolated: IsolateResult = field(default_factory=IsolateResult)
    exempt: set[int] = field(default_factory=set)
    times: dict[str, float] = field(default_factory=dict)
    lease: asyncio.TimerHandle | None = None
    watcher: asyncio.Future[Any] | None = None
    acks: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    release_wanted: str = ""
    locking: bool = False
    asked_exempt: list[int] = field(default_factory=list)
    watch_errors: list[str] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def exempts(self, pid: int, sessions: set[int]) -> bool:
        """Is ``pid`` part of the holder (decided when it is found, so what the holder starts
        after the grant counts too)? A registered session below the holder is not: it is a
        session of its own, frozen like any other (``sessions``: pids of the other sessions)."""
        if pid in self.exempt:
            return True
        chain = [pid, *ancestors(pid)]
        if self.session.pid not in chain:
            return False
        below = chain[: chain.index(self.session.pid)]
        return not any(p in sessions for p in below)

    def report(self, backend: dict[str, Any]) -> dict[str, Any]:
        degraded = bool(self.drain.not_drained or self.frozen.failed or self.isolated.failed)
        return {
            "region": self.id,
            "gpu": self.gpu,
            "session": self.session.id,
            "holder_pid": self.session.pid,
            "user": self.session.user,
            "name": self.session.name,
            "state": self.state,
            "exempted": self.asked_exempt,
            "max_hold_s": self.max_hold,
            **{f"{k}_s": round(v, 6) for k, v in self.times.items()},
            "drained": sorted(set(self.drain.acked) | set(self.drain.locked_pids)),
            "locked": self.drain.locked_pids + [p for p, _ in self.drain.late],
            "no_lock_needed": {str(k): v for k, v in self.drain.unlocked_ok.items()},
            "not_drained": {str(k): v for k, v in self.drain.not_drained.items()},
            "intruders": self.drain.intruders,
            "frozen": self.frozen.all_pids(),
            "frozen_cgroups": self.frozen.cgroups,
            "skipped_stopped": self.frozen.skipped,
            "moved": self.isolated.moved_pids,
            "cores": self.isolated.cores,
            "failures": self.frozen.failed + self.isolated.failed + self.watch_errors,
            "degraded": degraded,
            "expired": self.released_by == "lease expired",
            "released_by": self.released_by,
            "backend": backend["backend"],
            "simulated": backend["simulated"],
            "lock_capable": backend["capabilities"]["lock"],
        }


class Scheduler:
    def __init__(self, arbiter: Arbiter) -> None:
        self.arb = arbiter
        n = arbiter.gpu_count
        self.queues: dict[int, collections.deque[Region]] = {g: collections.deque() for g in range(n)}
        self.active: dict[int, Region | None] = dict.fromkeys(range(n))
        self.history: collections.deque[dict[str, Any]] = collections.deque(maxlen=arbiter.history)
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Future[Any]] = set()

    def _spawn(self, coro: Any) -> asyncio.Future[Any]:
        # Keep a reference: the loop holds tasks only weakly.
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- requests -------------------------------------------------------------------------
    def request(self, session: Session, gpu: int, max_hold: float, freeze: bool, isolate: bool,
                cores: int, reply: Reply) -> Region:
        region = Region(id=f"r{next(self._ids)}", gpu=gpu, session=session, max_hold=max_hold,
                        freeze=freeze, isolate=isolate, cores=cores, reply=reply)
        self.queues[gpu].append(region)
        self.arb.publish("region", {"event": "requested", "region": region.id, "gpu": gpu,
                                    "session": session.id, "queue": len(self.queues[gpu])})
        self._kick(gpu)
        return region

    def find(self, region_id: str) -> Region | None:
        for gpu, active in self.active.items():
            if active and active.id == region_id:
                return active
            for queued in self.queues[gpu]:
                if queued.id == region_id:
                    return queued
        return None

    def past(self, region_id: str) -> dict[str, Any] | None:
        return next((r for r in reversed(self.history) if r["region"] == region_id), None)

    async def release(self, region: Region, reason: str) -> dict[str, Any]:
        """Release a held region or withdraw a queued one; returns its final report."""
        if region.state == "queued":
            self.queues[region.gpu].remove(region)
            region.state = "released"
            region.released_by = reason
            region.reply(None, RegionCancelled(f"region {region.id} was withdrawn before its grant ({reason})"))
            report = self._finish_report(region)
            self.arb.publish("region", {"event": "withdrawn", **report})
            return report
        if region.state == "granting":
            region.release_wanted = reason
            await region.done.wait()
            return self.past(region.id) or {}
        if region.state == "held":
            await self._undo(region, reason)
        else:
            await region.done.wait()
        return self.past(region.id) or {}

    def session_gone(self, session: Session, reason: str) -> None:
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
            region = self.queues[gpu].popleft()
            self.active[gpu] = region
            region.state = "granting"
            self._spawn(self._grant(region))

    async def _grant(self, region: Region) -> None:
        arb = self.arb
        t0 = time.monotonic()
        region.times["wait"] = t0 - region.requested
        holder = region.session
        # The holder's ancestors and its own process tree, where the tree stops at processes
        # that are sessions of their own (a kernel started from a notebook, a pool on demand),
        # except those that registered as part of this very region (KREX_REGION).
        apart = self._other_session_pids(region)
        region.exempt = set(ancestors(holder.pid)) | set(tree_until(holder.pid, apart)) | arb.own_pids()
        region.exempt |= {p for pid in region.asked_exempt for p in tree(pid)}
        try:
            arb.gate.close(region.gpu, region.id, holder.pid)
            siblings = [s for s in arb.sessions.on_gpu(region.gpu)
                        if s.id != holder.id and s.pid not in region.exempt]
            await self._drain(region, siblings)
            t1 = time.monotonic()
            region.times["drain"] = t1 - t0
            if region.freeze:
                # Sessions that acknowledged the drain may already be stopped (see _drain).
                arb.freezer.freeze(region.id, [s.pid for s in siblings], region.exempt, result=region.frozen)
                # Grant only once the stops have landed: a sibling still running would share
                # the holder's first milliseconds. (Re-walking the trees waits till after.)
                while arb.freezer.pending(region.frozen) and time.monotonic() - t1 < 0.1:
                    await asyncio.sleep(0.0002)
            t2 = time.monotonic()
            region.times["freeze"] = t2 - t1
            if region.isolate:
                frozen = set(region.frozen.pids)
                others = [p for s in arb.sessions if s.pid not in region.exempt and s.pid not in frozen
                          for p in tree(s.pid) if p not in frozen and p not in region.exempt]
                region.isolated = arb.cores.isolate(
                    region.id, tree(holder.pid), sorted(set(others)), region.cores,
                    lambda threads: arb.journal.record("affinity", region.id, threads=threads))
            region.times["isolate"] = time.monotonic() - t2
            region.times["acquire"] = time.monotonic() - t0
        except Exception as exc:  # never leave a half-enforced region behind
            log.exception("region %s failed during enforcement", region.id)
            region.state = "held"
            await self._undo(region, f"enforcement failed: {exc}")
            region.reply(None, KrexError(f"enforcement failed and was undone: {exc}"))
            return
        region.state = "held"
        region.granted_at = time.monotonic()
        if region.release_wanted:
            await self._undo(region, region.release_wanted)
            return
        region.lease = asyncio.get_running_loop().call_later(region.max_hold, self._expire, region)
        if region.frozen.procs:
            self._spawn(self._settle_freeze(region, [s.pid for s in siblings]))
        if arb.locker.can_lock:
            region.watcher = self._spawn(self._watch_intruders(region))
        report = region.report(arb.backend_info)
        arb.publish("region", {"event": "granted", **report})
        region.reply({"region": region.id, "gpu": region.gpu, "report": report}, None)

    async def _settle_freeze(self, region: Region, roots: list[int]) -> None:
        """Walk the frozen trees again for children forked while the stops were in flight."""
        deadline = time.monotonic() + 1.0
        while region.state == "held" and time.monotonic() < deadline:
            if self.arb.freezer.pending(region.frozen):
                await asyncio.sleep(0.001)
                continue
            late = self.arb.freezer.settle(region.id, region.frozen, roots, region.exempt)
            if not late:
                return
            region.drain.intruders.extend(late)

    async def _drain(self, region: Region, siblings: list[Session]) -> None:
        """Lock what the driver can lock; ask the other KREX-aware sessions to synchronise.

        A session that is being locked is not also asked to synchronise: its sync call would
        block on the very lock until release.
        """
        arb = self.arb
        loop = asyncio.get_running_loop()
        targets: set[int] = set()
        lock_job = None
        if arb.locker.can_lock:
            targets = {p.pid for p in arb.backend.processes(region.gpu)}
            if not arb.lock_foreign:
                targets &= {p for s in arb.sessions for p in tree(s.pid)}
            targets -= region.exempt
            lock_job = arb.locker.lock_all(sorted(targets), region.drain, self._journal_lock(region))
        cooperative = [s for s in siblings if s.control is not None and s.pid not in targets]
        # Without driver locks nothing can be stopped before it is locked, so a session is
        # frozen the moment it has synchronised: drain and freeze overlap instead of adding up.
        freeze_on_ack = region.freeze and not arb.locker.can_lock
        for s in cooperative:
            ack = region.acks[s.id] = loop.create_future()
            if freeze_on_ack:
                ack.add_done_callback(functools.partial(self._freeze_acked, region, s.pid))
            arb.send_control(s, "drain", region)
        for s in siblings:
            if s.control is None and s.pid not in targets:
                region.drain.not_drained[s.pid] = "not KREX-aware (no control channel) and not lockable"
        waits: list[Any] = []
        if region.acks:
            waits.append(asyncio.wait(list(region.acks.values()), timeout=arb.drain_timeout))
        if lock_job is not None:
            waits.append(lock_job)
        await asyncio.gather(*waits)
        for s in cooperative:
            fut = region.acks.get(s.id)
            if fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None:
                region.drain.acked.append(s.pid)
            else:
                region.drain.not_drained[s.pid] = f"did not answer drain within {arb.drain_timeout:.2f} s"
            if fut is not None and not fut.done():
                fut.cancel()

    def _freeze_acked(self, region: Region, pid: int, fut: asyncio.Future[None]) -> None:
        if not fut.cancelled() and fut.exception() is None and region.state == "granting":
            self.arb.freezer.extend(region.id, region.frozen, [pid], region.exempt, passes=1)

    def _journal_lock(self, region: Region) -> Callable[[list[tuple[int, int]]], None]:
        backend = self.arb.backend.name
        return lambda procs: self.arb.journal.record("lock", region.id, backend=backend,
                                                     procs=[list(p) for p in procs])

    async def _watch_intruders(self, region: Region) -> None:
        """Lock processes that appear on the GPU while the region is held."""
        arb = self.arb
        loop = asyncio.get_running_loop()
        while region.state == "held":
            await asyncio.sleep(arb.poll_interval)
            try:
                listed = await loop.run_in_executor(None, arb.backend.processes, region.gpu)
            except Exception as exc:  # NVML hiccup: say so, keep watching
                region.watch_errors.append(str(exc))
                log.warning("region %s: listing GPU %d processes failed: %s", region.id, region.gpu, exc)
                continue
            known = set(region.drain.locked_pids) | set(region.drain.not_drained) | {p for p, _ in region.drain.late}
            known |= {p for p, why in region.drain.unlocked_ok.items() if why != "not-cuda"}
            sessions = self._other_session_pids(region)
            new = [p.pid for p in listed if p.pid not in known and not region.exempts(p.pid, sessions)]
            if new and region.state == "held":
                region.locking = True
                try:
                    await arb.locker.lock_all(new, region.drain, self._journal_lock(region))
                finally:
                    region.locking = False
                fresh = [p for p in new if p in region.drain.locked_pids and p not in region.drain.intruders]
                if fresh:
                    region.drain.intruders.extend(fresh)
                    arb.publish("region", {"event": "intruder", "region": region.id, "pids": fresh})

    def intruder_session(self, session: Session) -> None:
        """A session that registers on a GPU mid-region is drained and frozen (lock first)."""
        region = self.active.get(session.gpu)
        if region is None or region.state != "held":
            return
        if session.within == region.id or region.exempts(session.pid, self._other_session_pids(region)):
            return
        region.drain.intruders.append(session.pid)
        self._spawn(self._intrude(region, session))

    async def _intrude(self, region: Region, session: Session) -> None:
        arb = self.arb
        if arb.locker.can_lock:
            region.locking = True
            try:
                await arb.locker.lock_all(tree(session.pid), region.drain, self._journal_lock(region))
            finally:
                region.locking = False
        elif session.control is not None:
            arb.send_control(session, "drain", region)
        if region.freeze and region.state == "held":
            arb.freezer.extend(region.id, region.frozen, [session.pid], region.exempt)

    def _other_session_pids(self, region: Region) -> set[int]:
        return {s.pid for s in self.arb.sessions if s.id != region.session.id and s.within != region.id}

    def _expire(self, region: Region) -> None:
        if region.state != "held":
            return
        log.warning("region %s on GPU %d reached max_hold %.1f s: releasing", region.id, region.gpu,
                    region.max_hold)
        self.arb.send_control(region.session, "lease_expired", region)
        self._spawn(self.release(region, "lease expired"))

    async def _undo(self, region: Region, reason: str) -> None:
        arb = self.arb
        region.state = "releasing"
        region.released_by = reason
        if region.lease:
            region.lease.cancel()
        if region.watcher:
            # A watcher inside lock_all must finish: the locks it is making have to be undone.
            while region.locking:
                await asyncio.sleep(0.005)
            region.watcher.cancel()
        try:
            arb.cores.release(region.id)
            thaw(region.frozen)
            region.drain.closed = True
            errors = await arb.locker.unlock_all(region.drain.locked + region.drain.late)
            region.isolated.failed.extend(errors)
            for s in arb.sessions.on_gpu(region.gpu):
                if s.pid in region.drain.acked or s.pid in region.drain.intruders:
                    arb.send_control(s, "resume", region)
        finally:
            arb.journal.end(region.id)
            arb.gate.open(region.gpu)
            region.state = "released"
            if region.granted_at:
                region.times["hold"] = time.monotonic() - region.granted_at
            report = self._finish_report(region)
            arb.publish("region", {"event": "released", **report})
            self.active[region.gpu] = None
            region.done.set()
            self._kick(region.gpu)

    def _finish_report(self, region: Region) -> dict[str, Any]:
        report = region.report(self.arb.backend_info)
        self.history.append(report)
        return report

    async def shutdown(self) -> None:
        for gpu in self.queues:
            for region in list(self.queues[gpu]):
                await self.release(region, "arbiter shutting down")
            active = self.active[gpu]
            if active is not None:
                await self.release(active, "arbiter shutting down")
