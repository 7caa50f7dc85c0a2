"""Keeping a region's reserved cores while it runs, where affinities shield them.

The ``affinity`` shield moves every other thread off the reserved cores once, when the region
starts. Any process may call ``sched_setaffinity(0, all cores)`` again a moment later and is
back on them at once: a neighbour's busy loops took half of a holder's timing loop that way.
(A ``cpuset`` partition has no such hole: the kernel clamps every affinity outside it.)

:class:`AffinityWatch` is one thread that, every ``interval`` seconds while such regions hold,
looks at the affinity of every thread the shield moved (one syscall each), of every thread of
a process caught before, and of every process started since the shield went up, and puts any
that reaches a reserved core back off it (its mask as it was, journaled first, so that an undo
gives it back). What it found is kept per region: each intruding process, its owner, how many
times and how long in all (each time counted from the last look that found it off the cores,
so an upper bound). The region's report names them, and is degraded when one sat there longer
than the arbiter's bound.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..procutil import ancestors, proc_uid, start_time, threads
from .isolate import CoreBook
from .shield import node_pids

log = logging.getLogger("krex.watch")

RecordFn = Callable[..., None]  # Journal.record(kind, region, **data)


@dataclass
class Intrusion:
    """A process whose threads put themselves on a region's reserved cores."""

    pid: int
    uid: int
    times: int = 0
    seconds: float = 0.0


@dataclass
class _Watched:
    cores: set[int]
    holder: int
    #: tid -> (pid, process start): the threads the shield moved off the cores
    moved: dict[int, tuple[int, int]]
    #: the node walk the shield stands on (pid -> start): a pid not in it started since
    walked: dict[int, int]
    skip: set[int]
    #: processes started since, by (pid, start): True where they are the holder's own
    born: dict[tuple[int, int], bool] = field(default_factory=dict)
    #: processes caught before: all their threads are looked at (one may start more)
    suspects: dict[int, int] = field(default_factory=dict)
    found: dict[int, Intrusion] = field(default_factory=dict)
    last: float = field(default_factory=time.monotonic)


class AffinityWatch:
    """The watch thread (started with the first region, ended by :meth:`close`)."""

    def __init__(self, cores: CoreBook, record: RecordFn, interval: float = 0.01) -> None:
        self.cores = cores
        self.record = record
        self.interval = interval
        self._all = set(cores.cpus)
        self._watched: dict[str, _Watched] = {}
        self._lock = threading.Lock()
        self._looking = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None

    def add(self, region: str, cores: set[int], holder: int, walked: dict[int, int], skip: set[int]) -> None:
        """Watch ``region``'s ``cores`` from now (its shield is up: the core book knows what moved).
        ``skip``: processes never looked at (the frozen ones: stopped, they run nowhere)."""
        watched = _Watched(set(cores), holder, self.cores.moved_threads(region), dict(walked), set(skip) | {holder})
        with self._lock:
            self._watched[region] = watched
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="krex-watch", daemon=True)
                self._thread.start()
        self._wake.set()

    def remove(self, region: str) -> list[Intrusion]:
        """Stop watching ``region``; what intruded, longest first."""
        with self._looking, self._lock:  # not in the middle of a look: it would journal after the end
            watched = self._watched.pop(region, None)
        if watched is None:
            return []
        return sorted(watched.found.values(), key=lambda i: -i.seconds)

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop:
            with self._lock:
                regions = list(self._watched.items())
            if not regions:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            for name, watched in regions:
                with self._looking:
                    if name not in self._watched:
                        continue
                    try:
                        self._look(name, watched)
                    except Exception:  # a look must never end the watch
                        log.exception("watching region %s's cores failed", name)
            time.sleep(self.interval)

    def _look(self, region: str, w: _Watched) -> None:
        now = time.monotonic()
        caught: list[tuple[int, int, set[int]]] = []  # tid, pid, mask
        for tid, (pid, _) in list(w.moved.items()):
            mask = _affinity(tid)
            if mask is None:
                del w.moved[tid]  # exited
            elif mask & w.cores:
                caught.append((tid, pid, mask))
        pids, _, _ = node_pids(w.skip, None if os.geteuid() == 0 else os.geteuid(), known=w.walked)
        looked = set()
        for pid, start in pids.items():
            new = pid not in w.walked
            if not new and pid not in w.suspects:
                continue
            if new and self._holders(w, pid, start):
                continue
            for tid in threads([pid]):
                if tid in w.moved or tid in looked:
                    continue
                looked.add(tid)
                mask = _affinity(tid)
                if mask is not None and mask & w.cores:
                    caught.append((tid, pid, mask))
                elif mask is not None:  # looked at by syscall alone from now on
                    w.moved[tid] = (pid, start)
            if new:
                w.walked[pid] = start
        if caught:
            self._put_back(region, w, caught, now - w.last)
        w.last = time.monotonic()

    @staticmethod
    def _holders(w: _Watched, pid: int, start: int) -> bool:
        """Whether a process started since the shield went up is the holder's own (it runs on
        the holder's cores by right): decided once per process."""
        key = (pid, start)
        if key not in w.born:
            w.born[key] = w.holder in ancestors(pid)
        return w.born[key]

    def _put_back(self, region: str, w: _Watched, caught: list[tuple[int, int, set[int]]], since: float) -> None:
        # Journaled first with the mask each asked for: an undo gives it back as the release does.
        entries = []
        for tid, pid, mask in caught:
            start = start_time(pid)
            if start is not None:
                entries.append([tid, pid, start, sorted(mask)])
        if entries:
            self.record("threads", region, threads=entries)
        per_process: set[int] = set()
        for tid, pid, mask in caught:
            target = (mask - w.cores) or (self._all - w.cores - self.cores.reserved())
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, target)
            w.moved.setdefault(tid, (pid, 0))
            if pid not in per_process:
                per_process.add(pid)
                found = w.found.get(pid)
                if found is None:
                    found = w.found[pid] = Intrusion(pid, proc_uid(pid) or -1)
                found.times += 1
                found.seconds += since
            if pid not in w.suspects:
                w.suspects[pid] = 1
                w.walked.setdefault(pid, start_time(pid) or 0)


def _affinity(tid: int) -> set[int] | None:
    try:
        return os.sched_getaffinity(tid)
    except OSError:
        return None
