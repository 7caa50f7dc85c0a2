"""Step 3 of a region: drain other processes' GPU work.

Two parts, run together:

* **cooperative**: each KREX-aware session on the GPU (outside the holder's lineage) gets a
  ``drain`` control message, synchronises its device work and pauses, and answers
  ``drain_ack``. Sessions that do not answer within ``drain_timeout`` are named in the report.
  The arbiter owns the sockets, so it runs this part; :class:`DrainResult` collects it.
* **driver lock** (backends that can, i.e. NVIDIA): every process with a context on the GPU
  is locked with the backend's ``lock`` in parallel, each call in a worker thread under a
  deadline of the arbiter's own. A stopped process is never locked (the driver hangs on it),
  and a lock that completes after its deadline is undone at once, so that no process stays
  locked because KREX gave up on it. The checks before each call (gone, stopped, frozen) are
  made here on the event loop, each just before its call is handed to a thread (so that the
  next process's checks overlap this one's driver call): the threads then make only driver
  calls, which release the GIL, instead of 16 threads queueing on it for their /proc reads. A batch
  wakes the event loop once, when its last call returns (or at its deadline), not once a call:
  each wake-up is a hand-off of the GIL between the loop and the threads still returning.

Always lock before freezing: a frozen process cannot release the driver's locks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from ..errors import BackendError
from ..gpu.base import GpuBackend
from ..procutil import GONE, STOPPED, proc_state, settle_exits, state_and_start

log = logging.getLogger("krex.drain")

#: how long a process whose lock failed, or that stopped answering a drain, is given to show that
#: it is exiting before the region counts it as not drained
EXIT_GRACE = 0.05

JournalFn = Callable[[list[tuple[int, int]]], None]


@dataclass
class DrainResult:
    locked: list[tuple[int, int]] = field(default_factory=list)
    acked: list[int] = field(default_factory=list)
    not_drained: dict[int, str] = field(default_factory=dict)
    intruders: list[int] = field(default_factory=list)
    #: processes that needed no lock, with why ("already-locked", "checkpointed", "not-cuda")
    unlocked_ok: dict[int, str] = field(default_factory=dict)
    #: locks whose driver call returned after the deadline: undone at release (or at once if
    #: the region is over), never left behind
    late: list[tuple[int, int]] = field(default_factory=list)
    closed: bool = False

    @property
    def locked_pids(self) -> list[int]:
        return [p for p, _ in self.locked]


class Locker:
    """Runs a backend's blocking lock/unlock calls in threads, under deadlines."""

    def __init__(self, backend: GpuBackend, lock_timeout: float, threads: int = 16) -> None:
        self.backend = backend
        self.lock_timeout = lock_timeout
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="krex-lock")

    @property
    def can_lock(self) -> bool:
        return self.backend.capabilities.lock

    async def lock_all(self, pids: list[int], result: DrainResult, journal: JournalFn) -> None:
        targets: list[tuple[int, int]] = []
        cgroups: dict[str, bool] = {}  # one look at each cgroup's freezer a batch
        failure: list[Exception] = []  # a journal line that could not be written: no more locks

        def checked() -> Iterator[int]:
            for pid in pids:
                state, start = state_and_start(pid, kept=True)  # one read a sibling, every region
                if start is None or state in GONE:
                    result.unlocked_ok[pid] = "gone"  # exited since the GPU was listed: nothing to drain
                    continue
                if state in STOPPED:
                    result.not_drained[pid] = "stopped before the region (a stopped process cannot be locked)"
                    continue
                try:
                    if not self.backend.lock_check(pid, state, "lock", cgroups):
                        result.unlocked_ok[pid] = "gone"
                        continue
                except BackendError as exc:  # in a frozen cgroup
                    result.not_drained[pid] = str(exc)
                    continue
                try:
                    journal([(pid, start)])  # before its lock: a lock the arbiter dies making is undone
                except Exception as exc:
                    failure.append(exc)
                    return
                targets.append((pid, start))
                yield pid

        loop = asyncio.get_running_loop()
        lock = functools.partial(self.backend.lock, timeout_s=self.lock_timeout, checked=True)
        futures = await self._run_all(lock, checked(), self.lock_timeout + 0.5)
        for target, fut in zip(targets, futures):
            pid = target[0]
            if not fut.done():
                result.not_drained[pid] = f"lock did not return within {self.lock_timeout:.1f} s"
                # If the driver call finishes later, it must still be undone (on the loop).
                late = functools.partial(self._late, result=result, target=target)
                fut.add_done_callback(functools.partial(loop.call_soon_threadsafe, late))
            elif fut.exception() is not None:
                result.not_drained[pid] = f"lock failed: {fut.exception()}"
            elif fut.result() == "locked":
                result.locked.append(target)
                result.not_drained.pop(pid, None)
            else:
                result.unlocked_ok[pid] = str(fut.result())
        # A lock the driver refused because the process was ending (its context torn down under
        # the call) is no failure of the region: a process that exits or is exiting within
        # EXIT_GRACE is reported gone.
        refused = [t[0] for t, f in zip(targets, futures) if f.done() and f.exception() is not None]
        for pid in await settle_exits(refused, EXIT_GRACE) if refused else ():
            result.not_drained.pop(pid, None)
            result.unlocked_ok[pid] = "gone"
        if failure:  # the locks made so far are in the result: the region's undo unlocks them
            raise failure[0]

    async def _run_all(
        self, call: Callable[[int], object], pids: Iterable[int], timeout: float | None
    ) -> list[concurrent.futures.Future[object]]:
        """``call(pid)`` in the lock threads for every pid, each submitted as soon as ``pids``
        yields it (the checks of the next one then overlap the driver call of this one); returns
        their futures once all are done or ``timeout`` (None: no limit) has passed since the last
        was submitted (the late ones still running). The loop is woken once, by the last call to
        return, instead of once a call (asyncio's run_in_executor)."""
        loop = asyncio.get_running_loop()
        everything: asyncio.Future[None] = loop.create_future()
        left = [1]  # the calls not yet returned, and the submission itself until it ends
        count = threading.Lock()

        def settle() -> None:
            if not everything.done():
                everything.set_result(None)

        def one_done(_: object = None) -> None:  # in the thread that ran the call
            with count:
                left[0] -= 1
                last = left[0] == 0
            if last:
                loop.call_soon_threadsafe(settle)

        futures: list[concurrent.futures.Future[object]] = []
        for pid in pids:
            with count:
                left[0] += 1
            fut = self._pool.submit(call, pid)
            fut.add_done_callback(one_done)
            futures.append(fut)
        one_done()  # every call is submitted
        if not futures:
            return futures
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(everything, timeout)
        return futures

    def _late(self, fut: concurrent.futures.Future[object], *, result: DrainResult, target: tuple[int, int]) -> None:
        if fut.cancelled() or fut.exception() is not None or fut.result() != "locked":
            return
        if result.closed:
            self._pool.submit(self.backend.unlock, target[0])  # checked in its thread: off the loop
        else:
            result.late.append(target)

    async def unlock_all(self, procs: list[tuple[int, int]]) -> list[str]:
        """Unlock ``procs`` (thawed already), checks on the loop and driver calls in threads, as
        :meth:`lock_all`; returns the errors."""
        errors: list[str] = []
        ready: list[int] = []
        cgroups: dict[str, bool] = {}

        def checked() -> Iterator[int]:
            for pid, _ in procs:
                try:
                    alive = self.backend.lock_check(pid, proc_state(pid, kept=True), "unlock", cgroups)
                except BackendError as exc:
                    errors.append(f"unlock {pid}: {exc}")
                    continue
                if alive:
                    ready.append(pid)
                    yield pid

        unlock = functools.partial(self.backend.unlock, checked=True)
        # No deadline of the arbiter's: the region's end waits for its unlocks (a thawed process
        # answers; an unlock that hangs is the driver's bug, and the guardian's replay retries it).
        futures = await self._run_all(unlock, checked(), None)
        return errors + [f"unlock {pid}: {f.exception()}" for pid, f in zip(ready, futures) if f.exception()]

    def unlock_sync(self, procs: list[tuple[int, int]]) -> list[str]:
        """For the guardian and journal replay: unlock without an event loop, in parallel."""
        futures = {pid: self._pool.submit(self.backend.unlock, pid) for pid, _ in procs}
        errors = []
        deadline = time.monotonic() + self.lock_timeout
        for pid, fut in futures.items():
            try:
                fut.result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception as exc:
                errors.append(f"unlock {pid}: {exc}")
        return errors

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
