"""How many workers each GPU of the pool keeps, and starting them.

Per GPU the pool keeps ``workers_per_gpu`` *active* workers (they take jobs) and
``spares_per_gpu`` warm *spares* (they wait, context created, to replace an active worker that
dies or is recycled: promotion is instant; a new spare is then started). Leases bind an active
worker; while every active worker of a GPU is leased, one more is made active (up to
``max_workers_per_gpu``) so that plain jobs still have one; a client may ask for more active
workers per GPU while it lives (:meth:`Sizing.size`). Workers start at most
``start_concurrency`` at a time, never on a GPU whose gate is closed, and later and later on a
GPU where they keep failing to start.

:class:`Sizing` is the base of :class:`~.dispatcher.Dispatcher`, which says how a worker is
started and whether a GPU is open (those depend on its jobs); a class of its own so that the
sizing rules read apart from the queue and the leases.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

from .handle import WorkerHandle
from .jobs import DispatchConfig

__all__ = ["Sizing"]

log = logging.getLogger("krex.pool")


class Sizing:
    """The pool's workers per GPU: active, spare, starting, and the asks of its clients."""

    def __init__(self, config: DispatchConfig) -> None:
        self.config = config
        self.gpus: list[int] = []
        self.workers: dict[int, WorkerHandle] = {}
        self.counters: collections.Counter[str] = collections.Counter()
        #: GPU -> workers that failed to start there in a row; GPU -> when the next may start
        self._failures: dict[int, int] = {}
        self._retry_at: dict[int, float] = {}
        self._retry_handle: asyncio.TimerHandle | None = None
        self.closing = False
        #: client pid -> active workers per GPU it asked for (a batch's jobs per GPU)
        self.asked: dict[int, int] = {}
        #: client pid -> the most workers per GPU it lets the pool keep (a batch short of GPU memory)
        self.capped: dict[int, int] = {}

    def gpu_open(self, gpu: int) -> bool:
        """Whether a worker may start on ``gpu`` now (the dispatcher's gates and jobs say)."""
        raise NotImplementedError

    def _new_worker(self, gpu: int, active: bool) -> None:
        """Start one pool worker on ``gpu`` (the dispatcher's, which hears of its events)."""
        raise NotImplementedError

    def set_gpus(self, gpus: list[int]) -> None:
        """The GPUs to serve (known once the pool has asked the arbiter, when it starts serving)."""
        self.gpus = list(gpus)
        self._failures = {g: self._failures.get(g, 0) for g in gpus}
        self._retry_at = {g: self._retry_at.get(g, 0.0) for g in gpus}

    def size(self, pid: int, per_gpu: int, cap: bool = False) -> int:
        """Client ``pid`` asks for ``per_gpu`` active workers per GPU (0: no more); the pool keeps the
        largest live ask, within ``max_workers_per_gpu``. ``cap``: it lets the pool keep at most
        ``per_gpu`` workers per GPU, spares included (0: it lifts its cap); the smallest live cap
        holds over every ask and the pool's own size. Returns the active workers it keeps now."""
        which = self.capped if cap else self.asked
        if per_gpu > 0:
            which[pid] = per_gpu
        else:
            which.pop(pid, None)
        self.rebalance()
        return self.wanted_per_gpu()

    def forget(self, pid: int) -> bool:
        """Client ``pid`` is gone: its ask and its cap end (True: it had one)."""
        had = self.asked.pop(pid, None) is not None
        return self.capped.pop(pid, None) is not None or had

    def cap(self) -> int | None:
        """The most workers per GPU a live client lets the pool keep (None: no cap)."""
        return min(self.capped.values(), default=None)

    def wanted_per_gpu(self) -> int:
        asked = max(self.asked.values(), default=0)
        bound = max(self.config.max_workers_per_gpu, self.config.workers_per_gpu)
        wanted = min(bound, max(self.config.workers_per_gpu, asked))
        cap = self.cap()
        return wanted if cap is None else max(1, min(wanted, cap))

    def spares_per_gpu(self) -> int:
        """Spares kept per GPU: the pool's own, none under a cap (a spare holds a context too)."""
        return self.config.spares_per_gpu if self.cap() is None else 0

    def _alive(self, gpu: int) -> list[WorkerHandle]:
        """The GPU's pool workers (those started for one region job are not counted)."""
        return [
            w
            for w in self.workers.values()
            if w.gpu == gpu and w.state != "dead" and w.expected is None and w.for_job is None
        ]

    def target_active(self, gpu: int) -> int:
        leased = sum(1 for w in self._alive(gpu) if w.lease is not None)
        bound = max(self.config.max_workers_per_gpu, self.config.workers_per_gpu)
        cap = self.cap()
        if cap is not None:  # a client short of GPU memory: no more than its cap, or than the leases held
            bound = min(bound, max(cap, leased))
        return min(bound, max(self.wanted_per_gpu(), leased + 1))

    def rebalance(self) -> None:
        if self.closing:
            return
        want: dict[int, int] = {}
        for g in self.gpus:
            alive = self._alive(g)
            active = [w for w in alive if w.active]
            spares = [w for w in alive if not w.active]
            target = self.target_active(g)
            spares.sort(key=lambda w: (w.state != "idle", w.id))
            while len(active) < target and spares:
                s = spares.pop(0)
                s.active = True
                active.append(s)
            surplus = len(active) - target
            for w in [w for w in active if w.state == "idle" and w.lease is None][: max(0, surplus)]:
                w.active = False
                active.remove(w)
                spares.append(w)
            extra = len(spares) - self.spares_per_gpu()
            for w in [w for w in spares if w.state == "idle"][: max(0, extra)]:
                self.recycle(w, "more workers than needed")
                spares.remove(w)
            want[g] = max(0, target + self.spares_per_gpu() - len(active) - len(spares))
        self._spawn(want)

    def _spawn(self, want: dict[int, int]) -> None:
        loop = asyncio.get_running_loop()
        starting = sum(1 for w in self.workers.values() if w.state == "starting" and w.for_job is None)
        now = time.monotonic()
        later = [self._retry_at[g] for g, n in want.items() if n and self._retry_at[g] > now]
        order = sorted((g for g, n in want.items() if n), key=lambda g: -want[g])
        while starting < self.config.start_concurrency and order:
            for g in list(order):
                if starting >= self.config.start_concurrency:
                    break
                if want[g] <= 0 or self._retry_at[g] > now or not self.gpu_open(g):
                    order.remove(g)
                    continue
                want[g] -= 1
                starting += 1
                active = sum(1 for w in self._alive(g) if w.active) < self.target_active(g)
                self._new_worker(g, active)
        if later and self._retry_handle is None:

            def retry() -> None:
                self._retry_handle = None
                self.rebalance()

            self._retry_handle = loop.call_later(max(0.05, min(later) - now), retry)

    def recycle(self, w: WorkerHandle, reason: str) -> None:
        log.info("recycling worker %s (pid %s): %s", w.id, w.pid, reason)
        self.counters["recycled"] += 1
        w.kill(reason)

    def ready(self) -> bool:
        """Every GPU has its active workers up (used by tests and ``krex pool --wait``)."""
        return all(
            sum(1 for w in self._alive(g) if w.active and w.state != "starting") >= self.target_active(g)
            and len(self._alive(g)) >= self.target_active(g) + self.spares_per_gpu()
            and all(w.state != "starting" for w in self._alive(g))
            for g in self.gpus
        )
