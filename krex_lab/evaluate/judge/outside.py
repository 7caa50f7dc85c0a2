"""When a candidate's device work is done, as seen from outside its process.

A candidate answers a round when *it* says its calls are done; work it left queued on another
stream, or behind a patched synchronise, is not. :class:`Drain` ends a round from outside:

* :class:`CheckpointDrain` (NVIDIA, driver R550 and newer): the driver's checkpoint lock
  (``cuCheckpointProcessLock``) on each of the candidate's processes returns only once every
  piece of work the process submitted, on every stream, has finished; the judge reads its clock
  then and unlocks. The judge locks its own child inside its own region (the region's sequence
  is unchanged). The lock's rules (shared/FACTS.md): never on a stopped or frozen process (the
  driver then ignores its own timeout), so the state is read first; every call runs in a thread
  with a deadline of the judge's own, and a lock that returns after its deadline is undone.
* :class:`NoDrain` (a CPU, the fake backend, AMD, an older driver): there is no lock; a round
  ends when the candidate answers. :attr:`Drain.what` says so, and the verdict's metadata with it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import time
from typing import Any

from ...procutil import GONE, STOPPED, proc_state

__all__ = ["CheckpointDrain", "Drain", "DrainFailed", "NoDrain", "drain_for"]


class DrainFailed(Exception):
    """A process's device work could not be waited for: ``stopped`` (it is stopped or frozen:
    the lock would hang) or ``timeout`` (its work did not finish within the deadline)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Drain:
    """The interface: :meth:`settle` returns once the device work of ``pids`` is done (holding
    them where it can), :meth:`release` lets them go on."""

    #: whether a round's end is seen from outside (False: the candidate's answer ends it)
    available = False
    #: how a round ends, in words (the verdict's ``metadata.timing_drain``)
    what = "the candidate's answer (no lock on this device)"

    def settle(self, pids: list[int], timeout_s: float) -> list[int]:
        """Wait until every piece of device work ``pids`` submitted is done; returns the ones now
        held (to pass to :meth:`release`). Raises :class:`DrainFailed`."""
        return []

    def release(self, held: list[int]) -> None:
        """Let ``held`` run again."""

    def close(self) -> None:
        """Threads let go (a call still in the driver finishes on its own)."""


class NoDrain(Drain):
    def __init__(self, why: str) -> None:
        self.what = f"the candidate's answer ({why})"


class CheckpointDrain(Drain):
    """:class:`Drain` by the driver's checkpoint lock (``driver``: a
    :class:`~krex_lab.gpu.cuda_driver.CudaDriver`)."""

    available = True
    what = "the driver's checkpoint lock on every process of the candidate's (all streams drained)"

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="krex-judge-lock")

    def _lock(self, pid: int, timeout_ms: int) -> bool:
        """True: locked (to be unlocked); False: nothing to hold (gone, not a CUDA process, held)."""
        from ...gpu.cuda_driver import NOT_A_CUDA_PROCESS, CudaError, ProcessState

        try:
            self.driver.checkpoint_lock(pid, timeout_ms)
            return True
        except CudaError as exc:
            if proc_state(pid) in (None, *GONE):
                return False
            try:
                state = self.driver.checkpoint_state(pid)
            except CudaError as why:
                if why.code in NOT_A_CUDA_PROCESS or proc_state(pid) in (None, *GONE):
                    return False
                raise exc from None
            if state is ProcessState.RUNNING:
                raise exc
            return False  # already locked or checkpointed: it runs nothing on the device

    def _late(self, pid: int, fut: concurrent.futures.Future[bool]) -> None:
        """A lock that returned after its deadline is undone at once."""
        with contextlib.suppress(Exception):
            if fut.result() and proc_state(pid) not in (None, *GONE, *STOPPED):
                self.driver.checkpoint_unlock(pid)

    def settle(self, pids: list[int], timeout_s: float) -> list[int]:
        from ...gpu.nvidia import cgroup_frozen

        targets: list[int] = []
        for pid in pids:
            state = proc_state(pid)
            if state is None or state in GONE:
                continue
            if state in STOPPED or cgroup_frozen(pid):
                raise DrainFailed(
                    "stopped",
                    f"the candidate's process {pid} was stopped when its round ended: its device work cannot be "
                    "waited for (the driver's lock would hang)",
                )
            targets.append(pid)
        timeout_ms = max(1, int(timeout_s * 1000))
        futures = [(pid, self._pool.submit(self._lock, pid, timeout_ms)) for pid in targets]
        deadline = time.monotonic() + timeout_s + 2.0
        held: list[int] = []
        failure: DrainFailed | None = None
        for pid, fut in futures:
            try:
                if fut.result(timeout=max(0.0, deadline - time.monotonic())):
                    held.append(pid)
            except concurrent.futures.TimeoutError:
                fut.add_done_callback(functools.partial(self._late, pid))
                failure = failure or DrainFailed(
                    "timeout", f"the candidate's device work did not finish within {timeout_s:.1f} s of its answer"
                )
            except Exception as exc:
                failure = failure or DrainFailed("failed", f"the driver's lock of pid {pid} failed: {exc}")
        if failure is not None:
            self.release(held)
            raise failure
        return held

    def release(self, held: list[int]) -> None:
        for pid in held:
            # never unlock a stopped process (the driver's unlock talks to the target, as its lock)
            if proc_state(pid) in (None, *GONE, *STOPPED):
                continue
            fut = self._pool.submit(self.driver.checkpoint_unlock, pid)
            with contextlib.suppress(Exception):
                fut.result(timeout=5.0)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


@functools.cache
def _checkpoint_driver() -> tuple[Any, str]:
    """(the driver, "") or (None, why not)."""
    try:
        from ...gpu.cuda_driver import CtypesCudaDriver

        driver = CtypesCudaDriver()
    except Exception as exc:
        return None, f"no CUDA driver to lock with: {exc}"
    if not driver.has_checkpoint:
        return None, "the driver has no cuCheckpointProcessLock (R550 or newer needed)"
    return driver, ""


def drain_for(device: str) -> Drain:
    """The drain for a judge timing on ``device`` ("cuda" or "cpu")."""
    if device != "cuda":
        return NoDrain("a CPU: no device work outlives the call")
    torch = __import__("sys").modules.get("torch")
    if torch is not None and getattr(torch.version, "hip", None):
        return NoDrain("an AMD GPU: no driver lock")
    driver, why = _checkpoint_driver()
    if driver is None:
        return NoDrain(why)
    return CheckpointDrain(driver)
