"""Step 5 of a region: reserve CPU cores for the holder and move everyone else off them.

The :class:`CoreBook` is the arbiter's one view of who is pinned where. It remembers each
thread's *original* affinity the first time any region touches it, so that overlapping
regions on several GPUs restore exactly: a thread's affinity is always its original minus
the cores reserved by regions still held (or the holder's reserved cores, for a holder).
Originals are journaled before any affinity is changed. A book reserves cores only while it
holds the node's :class:`~.corelock.NodeCoreLock`: two books moving the same threads would
restore each other's narrowed masks.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..procutil import parent_pid, same_process, start_time, threads, tree
from .corelock import NodeCoreLock

JournalFn = Callable[[list[list[Any]]], None]


@dataclass
class IsolateResult:
    cores: list[int] = field(default_factory=list)
    holder_threads: list[int] = field(default_factory=list)
    moved_pids: list[int] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    #: every thread looked at (what is not among them at release was born during the region)
    seen: set[int] = field(default_factory=set)


def online_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]


class _Original(NamedTuple):
    """A thread's affinity before any region touched it, and the process it belongs to: the
    process's start time names it (one stat read per process, not one per thread)."""

    pid: int
    start: int
    cpus: set[int]


class _Alive:
    """Which recorded threads still are what was recorded: their process has the recorded start
    time and still lists the thread. One stat read and one task listing per process."""

    def __init__(self) -> None:
        self._tids: dict[tuple[int, int], set[int]] = {}

    def __call__(self, tid: int, pid: int, start: int) -> bool:
        key = (pid, start)
        if key not in self._tids:
            self._tids[key] = set(threads([pid])) if same_process(pid, start) else set()
        return tid in self._tids[key]


@dataclass
class _Held:
    cores: set[int]
    holder_tids: set[int]
    touched: set[int]
    #: the holder's process (its tree is looked at again at release: see CoreBook._born_pinned)
    holder: int = 0
    #: how many cores the region asked for (pick may give fewer): what an adopter must ask
    asked: int = 0


class CoreBook:
    def __init__(self, cpus: Iterable[int] | None = None, node_lock: NodeCoreLock | None = None) -> None:
        self.cpus = sorted(cpus) if cpus is not None else online_cpus()
        self.node_lock = node_lock if node_lock is not None else NodeCoreLock()
        self._original: dict[int, _Original] = {}  # tid -> its original affinity and process
        self._held: dict[str, _Held] = {}
        # The arbiter isolates in a worker thread; tests and tools may call from anywhere.
        self._lock = threading.Lock()

    def reserved(self) -> set[int]:
        return {c for h in self._held.values() for c in h.cores}

    def pick(self, n: int) -> list[int]:
        """``n`` free cores, highest first, never core 0 while another core exists."""
        taken = self.reserved()
        candidates = [c for c in reversed(self.cpus) if c not in taken and (c != 0 or len(self.cpus) == 1)]
        # Someone must be left to run everyone else: keep at least one unreserved core.
        room = len(self.cpus) - len(taken) - 1
        return sorted(candidates[: max(0, min(n, room))])

    def reserve(self, region: str, n: int) -> list[int]:
        """Set ``n`` cores aside for ``region`` before :meth:`isolate` pins anyone to them (so that
        the shield can take them first); [] when none is free."""
        with self._lock:
            cores, _ = self._claim(n)
            if cores:
                self._held[region] = _Held(cores=set(cores), holder_tids=set(), touched=set(), asked=n)
            return cores

    def _claim(self, n: int) -> tuple[list[int], str]:
        """Free cores for a new region and the node's lock with them; ([], why) when none."""
        cores = self.pick(n)
        if not cores:
            return [], f"no core to reserve among {len(self.cpus)} (others hold the rest)"
        why = self.node_lock.acquire()
        return ([], why) if why else (cores, "")

    def isolate(
        self,
        region: str,
        holder_pids: list[int],
        other_pids: Iterable[int],
        n: int,
        journal: JournalFn,
        deadline: float | None = None,
        starts: Mapping[int, int] | None = None,
        born_since: int | None = None,
    ) -> IsolateResult:
        """Pin the holder's threads to ``n`` reserved cores and move the others' threads off them.

        Work on other threads stops at ``deadline`` (monotonic): those not reached keep their
        affinity and ``failed`` says how many, so the region reports itself degraded. ``starts``
        gives processes' start times already read (the shield's node walk reads them).
        ``born_since`` (boot ticks; a region that adopted a lingering shield): a thread first seen
        here that started since then inherited a mask the shield narrowed, so its original is
        its process's (or, for a new process, its parent's) original, not its mask.
        """
        with self._lock:
            return self._isolate(region, holder_pids, other_pids, n, journal, deadline, dict(starts or {}), born_since)

    def _isolate(
        self,
        region: str,
        holder_pids: list[int],
        other_pids: Iterable[int],
        n: int,
        journal: JournalFn,
        deadline: float | None,
        starts: dict[int, int | None],
        born_since: int | None = None,
    ) -> IsolateResult:
        late = (lambda: False) if deadline is None else (lambda: time.monotonic() > deadline)
        reserved = self._held.get(region)
        cores_now, why = (sorted(reserved.cores), "") if reserved is not None else self._claim(n)
        result = IsolateResult(cores=cores_now)
        if not result.cores:
            result.failed.append(why)
            if not self._held:
                self.node_lock.release()
            return result
        cores = set(result.cores)
        holder_tids = {tid: pid for pid in holder_pids for tid in threads([pid])}
        other_tids: dict[int, int] = {}
        unlisted = 0
        for pid in other_pids:
            if late():
                unlisted += 1
                continue
            for tid in threads([pid]):
                if tid not in holder_tids:
                    other_tids[tid] = pid
        fresh: list[list[Any]] = []
        for tid, pid in [*holder_tids.items(), *other_tids.items()]:
            if tid in self._original:
                continue
            if tid not in holder_tids and late():
                break
            try:
                original = os.sched_getaffinity(tid)
            except OSError:
                continue
            if pid not in starts:
                starts[pid] = start_time(pid)
            start = starts[pid]
            if start is None:  # the process is gone
                continue
            if born_since is not None and (start_time(tid) or 0) >= born_since:
                original = self._creator_original(pid) or original
            self._original[tid] = _Original(pid, start, original)
            fresh.append([tid, pid, start, sorted(original)])
        if fresh:
            journal(fresh)
        held = _Held(
            cores=cores,
            holder_tids=set(holder_tids),
            touched=reserved.touched if reserved else set(),
            holder=holder_pids[0] if holder_pids else 0,
            asked=reserved.asked if reserved else n,
        )
        self._held[region] = held
        moved: set[int] = set()
        for tid in holder_tids:
            if self._apply(tid, cores, result):
                held.touched.add(tid)
        skipped = 0
        for tid, pid in other_tids.items():
            if late():
                skipped += 1
                continue
            if tid not in self._original:  # exited before its affinity could be read
                continue
            target = self._target(tid)
            if target is None:
                continue
            if target == self._original[tid].cpus:
                # Its original has none of the reserved cores (so no region changed it either):
                # nothing to change, nothing to restore, and nothing to remember (the thread may
                # change its own affinity before the next region looks).
                if not any(tid in h.touched for h in self._held.values()):
                    self._original.pop(tid, None)
                continue
            if self._set(tid, target, result):
                held.touched.add(tid)
                moved.add(pid)
        if skipped or unlisted:
            result.failed.append(deadline_failure(skipped, unlisted))
        result.holder_threads = sorted(holder_tids)
        result.moved_pids = sorted(moved)
        result.seen = set(holder_tids) | set(other_tids)
        return result

    def touched(self, region: str) -> int:
        """How many threads ``region`` has re-pinned (what its release must restore)."""
        held = self._held.get(region)
        return len(held.touched) if held is not None else 0

    def release(self, region: str) -> int:
        """Give back ``region``'s cores; every thread it touched gets what is left of its original."""
        with self._lock:
            return self._release(region)

    def _release(self, region: str) -> int:
        held = self._held.pop(region, None)
        if held is None:
            return 0
        try:
            return self._restore(held.touched | self._born_pinned(held))
        finally:
            if not self._held:
                self.node_lock.release()

    def linger(self, region: str, name: str) -> list[list[Any]]:
        """End ``region`` but keep its cores reserved under ``name``: the holder's threads get what
        is left of their originals (they are others now), everyone else stays off the cores, so
        that the next region can :meth:`adopt` them without walking the node again. Returns the
        originals the lingering reservation must restore (for the journal, under ``name``)."""
        with self._lock:
            held = self._held.pop(region, None)
            if held is None:
                return []
            self._held[name] = held
            holder, held.holder_tids = held.holder_tids, set()
            self._restore((holder & held.touched) | self._born_pinned(held))
            return self._originals(held.touched)

    def adopt(self, name: str, region: str, n: int) -> list[int]:
        """Give the cores kept by :meth:`linger` under ``name`` to ``region`` if it wants as many;
        [] (and nothing changed) otherwise."""
        with self._lock:
            held = self._held.get(name)
            if held is None or held.asked != n:
                return []
            self._held[region] = self._held.pop(name)
            return sorted(held.cores)

    def moved_threads(self, region: str) -> dict[int, tuple[int, int]]:
        """tid -> (pid, process start) of every thread ``region`` moved off its cores (the
        holder's aside): what :class:`~krex_lab.enforcement.watch.AffinityWatch` looks at."""
        with self._lock:
            held = self._held.get(region)
            if held is None:
                return {}
            return {
                tid: (o.pid, o.start)
                for tid in held.touched - held.holder_tids
                if (o := self._original.get(tid)) is not None
            }

    def cores_of(self, region: str) -> set[int]:
        """The cores ``region`` holds (set() when it holds none)."""
        with self._lock:
            held = self._held.get(region)
            return set(held.cores) if held is not None else set()

    def _creator_original(self, pid: int) -> set[int] | None:
        """The original affinity of ``pid``'s main thread, else of its parent's (a new process)."""
        main = self._original.get(pid)
        if main is None:
            parent = parent_pid(pid)
            main = self._original.get(parent) if parent else None
        return set(main.cpus) if main is not None else None

    def originals(self, region: str) -> list[list[Any]]:
        """(tid, pid, process start, original cpus) of every thread ``region`` keeps narrowed."""
        with self._lock:
            held = self._held.get(region)
            return self._originals(held.touched) if held is not None else []

    def _originals(self, tids: set[int]) -> list[list[Any]]:
        return [[tid, o.pid, o.start, sorted(o.cpus)] for tid in sorted(tids) if (o := self._original.get(tid))]

    def _born_pinned(self, held: _Held) -> set[int]:
        """Threads and processes the holder started during the region inherited its pinned mask
        (a thread pool made by the first operation timed, say), which the book never recorded.
        Records each with the holder's original, as if it had been there all along (touched by
        ``held``), for :meth:`_restore` to give it what it should have now."""
        main = self._original.get(held.holder)
        if main is None:
            return set()
        born: set[int] = set()
        for pid in tree(held.holder):
            start = main.start if pid == held.holder else start_time(pid)
            for tid in threads([pid]):
                if tid in self._original or start is None:
                    continue
                try:
                    if os.sched_getaffinity(tid) != held.cores:
                        continue
                except OSError:
                    continue
                self._original[tid] = _Original(pid, start, main.cpus)
                held.touched.add(tid)
                born.add(tid)
        return born

    def _restore(self, tids: set[int]) -> int:
        """Every thread of ``tids`` gets its affinity under the regions still held (its original
        when none narrows it)."""
        n = 0
        alive = _Alive()
        for tid in tids:
            recorded = self._original.get(tid)
            if recorded is None or not alive(tid, recorded.pid, recorded.start):
                self._original.pop(tid, None)
                continue
            target = self._target(tid)
            original = recorded.cpus
            if target is None:
                target = original
            try:
                os.sched_setaffinity(tid, target)
                n += 1
            except OSError:
                pass
            if target == original and not any(tid in h.touched for h in self._held.values()):
                self._original.pop(tid, None)
        return n

    def widen_born(self, pids: Iterable[int], cores: set[int], since: int, known: set[int] | None = None) -> int:
        """Threads and processes born during a region (start time >= ``since``, boot ticks) inherit
        their creator's narrowed affinity, which the core book never recorded. Once the creator has
        its own back, give each what its creator has (less cores still reserved). Returns how many."""
        with self._lock:
            reserved = self.reserved()
            n = 0
            for pid in pids:
                try:
                    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
                except OSError:
                    continue
                for tid in tids:
                    if tid in self._original or (known is not None and tid in known):
                        continue
                    start = start_time(tid)
                    creator = pid if tid != pid else parent_pid(pid)
                    if start is None or start < since or not creator:
                        continue
                    try:
                        mine, theirs = os.sched_getaffinity(tid), os.sched_getaffinity(creator)
                    except OSError:
                        continue
                    if mine & cores or not theirs & cores or mine != theirs - cores:
                        continue  # not the creator's mask less the region's cores: its own choice
                    try:
                        os.sched_setaffinity(tid, (theirs - reserved) or theirs)
                        n += 1
                    except OSError:
                        continue
            return n

    def _target(self, tid: int) -> set[int] | None:
        """Affinity a thread should have under the regions still held (None: its original)."""
        for h in self._held.values():
            if tid in h.holder_tids:
                return h.cores
        reserved = self.reserved()
        if not reserved:
            return None
        original = self._original[tid].cpus
        allowed = original - reserved
        return allowed or (set(self.cpus) - reserved)

    @staticmethod
    def _set(tid: int, cpus: set[int], result: IsolateResult) -> bool:
        try:
            os.sched_setaffinity(tid, cpus)
            return True
        except ProcessLookupError:
            return False
        except OSError as exc:
            result.failed.append(f"thread {tid}: {exc.strerror}")
            return False

    @classmethod
    def _apply(cls, tid: int, cpus: set[int], result: IsolateResult) -> bool:
        """:meth:`_set` unless the thread has that affinity already."""
        try:
            if os.sched_getaffinity(tid) == cpus:
                return True
        except OSError:
            pass  # gone, or not ours to read: _set says which
        return cls._set(tid, cpus, result)


def restore_threads(records: Iterable[list[Any]]) -> int:
    """Journal replay: put every (tid, pid, process start, cpus) back where it was, where that
    process still is the one recorded and still has the thread (also the (tid, thread start,
    cpus) of journals before 2026-12-01 evening). Returns how many."""
    n = 0
    alive = _Alive()
    for record in records:
        if len(record) == 4:
            tid, pid, start, cpus = record
            if not alive(int(tid), int(pid), start):
                continue
        else:
            tid, start, cpus = record
            if not same_process(int(tid), start):
                continue
        try:
            os.sched_setaffinity(int(tid), set(cpus))
            n += 1
        except OSError:
            continue
    return n


def deadline_failure(threads: int, processes: int) -> str:
    """What isolation says when its deadline (``Arbiter.isolate_deadline``) came first: who may
    still run on the reserved cores, in plain words."""
    left = []
    if processes:
        left.append(f"{processes} other session process{'es' if processes != 1 else ''}")
    if threads:
        left.append(f"{threads} other session thread{'s' if threads != 1 else ''}")
    return (
        f"not isolated in time: {' and '.join(left)} may still run on the reserved cores"
        " (the isolation deadline passed before they were moved)"
    )
