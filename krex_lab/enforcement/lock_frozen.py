"""Locking a process the region froze itself: continue it, lock it, stop it again.

The driver's checkpoint lock hangs on a stopped process (shared/FACTS.md), so a drain never locks
one. But a region stops its siblings' trees whole, and a process in such a tree may make its first
GPU context just then (an evaluation's spare makes its own while idle, beside its judge): it shows
on the GPU's list only once the region holds, stopped by the region itself. It is no process
"stopped before the region": it is the region's own, and may have queued GPU work before its stop
landed. These helpers let the intruder watch resume exactly those processes (the ones this region
stopped, told by pid and start time, through the pidfd kept for the thaw), lock them, and stop them
again; the release then thaws and unlocks them as everything else it froze and locked.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable

from ..procutil import STOPPED, proc_state, same_process
from .freeze import FreezeResult

__all__ = ["resume_stopped", "still_stopped", "stop_again", "stopped_here"]


def stopped_here(frozen: FreezeResult, pids: Iterable[int]) -> dict[int, int]:
    """Those of ``pids`` this region stopped itself (the same processes: their start times):
    pid -> start time. A stop still in flight counts too: it would land under the lock."""
    mine = dict(frozen.procs)
    return {pid: mine[pid] for pid in pids if pid in mine and same_process(pid, mine[pid])}


def _signal(frozen: FreezeResult, procs: dict[int, int], sig: signal.Signals) -> None:
    for pid, start in procs.items():
        fd = frozen.pidfds.get(pid)
        with contextlib.suppress(OSError):  # it exited: nothing to lock or stop
            if fd is not None:
                signal.pidfd_send_signal(fd, sig)
            elif same_process(pid, start):
                os.kill(pid, sig)


def resume_stopped(frozen: FreezeResult, procs: dict[int, int]) -> None:
    """SIGCONT ``procs`` (this region's stops, :func:`stopped_here`), so they can be locked."""
    _signal(frozen, procs, signal.SIGCONT)


def still_stopped(procs: dict[int, int]) -> list[int]:
    """Those of ``procs`` that still show a stopped state (a continue wakes a process at once)."""
    return [pid for pid in procs if proc_state(pid) in STOPPED]


def stop_again(frozen: FreezeResult, procs: dict[int, int]) -> None:
    """SIGSTOP ``procs`` again once they are locked: frozen for the rest of the region."""
    _signal(frozen, procs, signal.SIGSTOP)
