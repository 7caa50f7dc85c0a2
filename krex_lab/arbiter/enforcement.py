"""The enforcement steps of a region as one bundle, and the isolation step built on them.

:class:`Enforcement` is what the :class:`~.scheduler.Scheduler` is given (gate, locker, freezer,
core book, shield, journal); :func:`isolate` and :func:`unisolate` run in the scheduler's isolation
thread (a node's thousands of threads must not stall the event loop).

**A lingering shield.** With the affinity shield most of a region's own cost is the node walk and
the affinity calls, at its start and again at its end (on the H200, 0.58 + 0.51 ms of a 2.46 ms
round trip with no sibling; 2026-12-02 ...T1851). Regions often come back to back (a timing loop
of short regions, a queue of agents), so the end of one (``Enforcement.linger`` > 0) gives only
its holder's threads back: everyone else stays off the reserved cores for ``linger`` seconds,
journaled under a name of its own (``<region>-shield``). A region that starts meanwhile and wants
as many cores :func:`adopts <isolate>` them: it pins its holder and moves only processes the
lingering shield has not moved (born since its walk, or frozen while it was made). When the time
is up, :func:`end_linger` restores everyone, as a region's end did before. A chain of adoptions
ends after ``FRESH_WALK`` seconds (pids are reused, slowly) or ``LINGER_JOURNAL_MAX`` bytes of
journal (it starts afresh only when nothing is outstanding), and the next region walks anew.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..enforcement.drain import Locker
from ..enforcement.freeze import Freezer
from ..enforcement.gate import Gate
from ..enforcement.isolate import CoreBook, IsolateResult
from ..enforcement.shield import Shield, ShieldResult, node_pids
from ..enforcement.watch import AffinityWatch
from ..gpu.base import GpuProcess
from ..procutil import boot_ticks, tree, tree_until
from .journal import Journal
from .region import Region

#: how long a chain of adopted shields trusts its first node walk (see the module docstring)
FRESH_WALK = 1.0
#: a chain also ends once the journal holds this much: the journal starts afresh only when
#: nothing is outstanding, and a chain (with a region or its linger always open) never lets it
LINGER_JOURNAL_MAX = 4 << 20


@dataclass
class Linger:
    """A region's shield kept up after its end, under ``name`` (see the module docstring)."""

    name: str
    cores: set[int]
    #: boot ticks when the first shield of the chain went up (what started since inherited it)
    since: int
    #: the chain's node walks: pid -> start time of every process the shield moved off the cores
    walked: dict[int, int]
    #: every thread the chain looked at
    seen: set[int]
    #: when the chain's first walk was made (monotonic)
    walked_at: float


class LingerSlot:
    """The one lingering shield of an arbiter, if any. Taken atomically: a region's grant (in
    the isolation thread or on the loop) and the timer that ends it never both have it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._linger: Linger | None = None

    def put(self, linger: Linger) -> bool:
        """Keep ``linger``; False if another region's shield lingers already (one at a time)."""
        with self._lock:
            if self._linger is not None:
                return False
            self._linger = linger
            return True

    def take(self, name: str | None = None) -> Linger | None:
        """The lingering shield (only if it is ``name``, when given), no longer lingering."""
        with self._lock:
            linger = self._linger
            if linger is None or (name is not None and linger.name != name):
                return None
            self._linger = None
            return linger


@dataclass(frozen=True)
class Enforcement:
    """The enforcement steps of a region and the journal they write to, as one bundle."""

    gate: Gate
    locker: Locker
    freezer: Freezer
    cores: CoreBook
    journal: Journal
    #: the processes with a context on a GPU (the backend's list; the fake backend has none)
    gpu_processes: Callable[[int], list[GpuProcess]]
    backend_name: str
    #: the arbiter's own processes (itself, its guardian): never locked or frozen
    own_pids: Callable[[], set[int]]
    #: what keeps everyone but the holder off its reserved cores (default: KREX sessions only)
    shield: Shield = field(default_factory=lambda: Shield("sessions"))
    #: seconds a region's affinity shield stays up after its end for the next region to adopt (0: never)
    linger: float = 0.0
    lingering: LingerSlot = field(default_factory=LingerSlot)
    #: puts back threads that widen onto an affinity-shielded region's cores (None: no watch)
    watch: AffinityWatch | None = None
    #: seconds on the reserved cores past which an intruder degrades the region
    intrusion_bound: float = 0.1

    def lock_journal(self, region: str) -> Callable[[list[tuple[int, int]]], None]:
        """What the locker journals its locks with, for ``region``."""
        return lambda procs: self.journal.record(
            "lock", region, backend=self.backend_name, procs=[list(p) for p in procs]
        )


def isolate(steps: Enforcement, region: Region, roots: list[int], apart: set[int], deadline: float) -> IsolateResult:
    """Reserve cores for the holder's threads and keep everyone else off them: the shield
    (a cpuset partition, or every process's affinity) or, in ``sessions`` mode, other sessions'
    threads. In the isolation thread: thousands of threads must not stall the loop."""
    frozen = set(region.frozen.pids)
    holder = tree_until(region.session.pid, apart)
    linger = steps.lingering.take()
    cores: list[int] = []
    if linger is not None:
        if time.monotonic() - linger.walked_at < FRESH_WALK:
            cores = steps.cores.adopt(linger.name, region.id, region.cores)
        if cores:
            # Journaled under this region before the linger's own entry ends: always one names them.
            steps.journal.record("threads", region.id, threads=steps.cores.originals(region.id))
            steps.journal.end(linger.name)
            region.shielded = ShieldResult(mode="affinity", adopted=linger.name)
        else:
            end_linger(steps, linger)
    if not cores:
        cores = steps.cores.reserve(region.id, region.cores)
        if cores:
            region.shielded = steps.shield.take(region.id, set(cores), holder, steps.journal.record)
    others: dict[int, int] | list[int] = []
    region.shielded.since = boot_ticks() - 1  # a tick's slack: start times are rounded down
    if region.shielded.mode == "affinity":
        # Frozen processes do not run: moving them would only cost time (and undoing it).
        walked = linger.walked if region.shielded.adopted and linger is not None else None
        every, region.shielded.kernel_threads, foreign = node_pids(frozen | set(holder), _movable_uid(), known=walked)
        # An adopted shield moved the others already; what it did not walk is left to move.
        others = every if walked is None else {p: s for p, s in every.items() if p not in walked}
        region.shielded.walked = every
        region.shielded.walked_at = time.monotonic()
        if linger is not None and walked is not None:
            region.shielded.since, region.shielded.walked_at = linger.since, linger.walked_at
        if foreign:
            region.shielded.notes.append(f"{foreign} processes of other users left (the arbiter is not root)")
    elif region.shielded.mode == "sessions":
        others = sorted(
            {
                p
                for root in roots
                if root not in frozen
                for p in tree(root)
                if p not in frozen and p not in region.exempt
            }
        )
    result = steps.cores.isolate(
        region.id,
        holder,
        others,
        region.cores,
        lambda threads: steps.journal.record("threads", region.id, threads=threads),
        deadline,
        starts=region.shielded.walked,
        born_since=linger.since if linger is not None and region.shielded.adopted else None,
    )
    if linger is not None and region.shielded.adopted:
        result.seen |= linger.seen
    region.shielded.processes = len(result.moved_pids)
    if steps.watch is not None and region.shielded.mode == "affinity" and result.cores:
        region.shielded.intrusion_bound = steps.intrusion_bound
        steps.watch.add(region.id, set(result.cores), region.session.pid, region.shielded.walked, frozen | set(holder))
    return result


def unisolate(steps: Enforcement, region: Region) -> Linger | None:
    """Give the reserved cores back: the partition and IRQs first (moving the holder back
    to its cgroup resets its affinity), then every affinity the core book changed. The walk for
    threads born meanwhile comes after the restore and lists tasks afresh: one born before the
    restore inherited the narrowed mask and must be seen. With ``steps.linger``, an affinity
    shield stays up instead (only the holder's threads get theirs back) and is returned: the
    caller ends it with :func:`end_linger` unless the next region adopted it first."""
    if steps.watch is not None:
        region.shielded.intrusions = steps.watch.remove(region.id)
    region.isolated.failed.extend(steps.shield.give_back(region.id))
    shielded = region.shielded
    cores = steps.cores.cores_of(region.id)  # (an adopted shield's, also if its isolate failed)
    if not (shielded.mode == "affinity" and cores):
        steps.cores.release(region.id)
        return None
    walked_at = shielded.walked_at or region.granted_at or time.monotonic()
    if steps.linger > 0 and time.monotonic() - walked_at < FRESH_WALK and steps.journal.written < LINGER_JOURNAL_MAX:
        name = f"{region.id}-shield"
        kept = steps.cores.linger(region.id, name)
        steps.journal.record("threads", name, threads=kept)  # before the region's own entries end
        linger = Linger(name, cores, shielded.since, shielded.walked, region.isolated.seen, walked_at)
        if steps.lingering.put(linger):
            shielded.lingers = name
            return linger
        end_linger(steps, linger)  # another region's shield lingers (regions on two GPUs)
        return None
    steps.cores.release(region.id)
    # A process this region kept stopped made nothing during it, but may have during the chain
    # of shields it adopted: look at every process then.
    stopped = {} if shielded.adopted else dict(region.frozen.procs)
    _widen_born(steps, shielded.walked, cores, shielded.since, region.isolated.seen, stopped)
    return None


def end_linger(steps: Enforcement, linger: Linger) -> None:
    """Give a lingering shield's cores back: everyone gets their original affinity."""
    steps.cores.release(linger.name)
    _widen_born(steps, linger.walked, linger.cores, linger.since, linger.seen, {})
    steps.journal.end(linger.name)


def end_linger_named(steps: Enforcement, name: str | None) -> None:
    """The timer's end of a linger (in the isolation thread, after any grant queued before it,
    which may have adopted it): :func:`end_linger`, unless it is no longer ``name``'s (None:
    whichever lingers, at shutdown)."""
    linger = steps.lingering.take(name)
    if linger is not None:
        end_linger(steps, linger)


def _widen_born(
    steps: Enforcement, walked: dict[int, int], cores: set[int], since: int, seen: set[int], stopped: dict[int, int]
) -> None:
    pids, _, _ = node_pids(set(), _movable_uid(), known=walked)
    # A process stopped for the whole region (the same one: its start time, read by this very
    # walk, is the one it was stopped with) made nothing meanwhile, and the shield never
    # narrowed it: none of its threads need looking at (a frozen sibling's threads cost
    # most of the release's walk).
    pids = {p: start for p, start in pids.items() if p in walked or stopped.get(p) != start}
    steps.cores.widen_born(pids, cores, since, known=seen)


def _movable_uid() -> int | None:
    """Whose processes the shield may move: everyone's for root (None), else only this user's."""
    return None if os.geteuid() == 0 else os.geteuid()
