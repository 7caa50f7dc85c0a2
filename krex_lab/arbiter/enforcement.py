"""The enforcement steps of a region as one bundle, and the isolation step built on them.

:class:`Enforcement` is what the :class:`~.scheduler.Scheduler` is given (gate, locker, freezer,
core book, shield, journal); :func:`isolate` and :func:`unisolate` run in the scheduler's isolation
thread (a node's thousands of threads must not stall the event loop).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from ..gpu.base import GpuProcess
from ..procutil import boot_ticks, tree, tree_until
from ..regions.drain import Locker
from ..regions.freeze import Freezer
from ..regions.gate import Gate
from ..regions.isolate import CoreBook, IsolateResult
from ..regions.shield import Shield, node_pids
from .journal import Journal
from .region import Region


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
    cores = steps.cores.reserve(region.id, region.cores)
    if cores:
        region.shielded = steps.shield.take(region.id, set(cores), holder, steps.journal.record)
    others: dict[int, int] | list[int] = []
    region.shielded.since = boot_ticks() - 1  # a tick's slack: start times are rounded down
    if region.shielded.mode == "affinity":
        # Frozen processes do not run: moving them would only cost time (and undoing it).
        others, region.shielded.kernel_threads, foreign = node_pids(frozen | set(holder), _movable_uid())
        region.shielded.walked = others
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
    )
    region.shielded.processes = len(result.moved_pids)
    return result


def unisolate(steps: Enforcement, region: Region) -> None:
    """Give the reserved cores back: the partition and IRQs first (moving the holder back
    to its cgroup resets its affinity), then every affinity the core book changed. The walk for
    threads born meanwhile comes after the restore and lists tasks afresh: one born before the
    restore inherited the narrowed mask and must be seen."""
    region.isolated.failed.extend(steps.shield.give_back(region.id))
    steps.cores.release(region.id)
    if region.shielded.mode == "affinity" and region.isolated.cores:
        walked = region.shielded.walked
        pids, _, _ = node_pids(set(), _movable_uid(), known=walked)
        # A process stopped for the whole region (the same one: its start time, read by this very
        # walk, is the one it was stopped with) made nothing meanwhile, and the shield never
        # narrowed it: none of its threads need looking at (a frozen sibling's threads cost
        # most of the release's walk).
        stopped = dict(region.frozen.procs)
        pids = {p: start for p, start in pids.items() if p in walked or stopped.get(p) != start}
        steps.cores.widen_born(pids, set(region.isolated.cores), region.shielded.since, known=region.isolated.seen)


def _movable_uid() -> int | None:
    """Whose processes the shield may move: everyone's for root (None), else only this user's."""
    return None if os.geteuid() == 0 else os.geteuid()
