"""Process containment: every process a job started is gone when the job ends, daemons included.

A daemon leaves its job's process group and session (``setsid``) and its parent (double fork),
so neither ``killpg`` nor a walk of the worker's tree at the end would find it: it would be
re-parented to init and outlive the job, the worker and the pool. So both the context worker
and the pool are **child subreapers** (``prctl(PR_SET_CHILD_SUBREAPER)``): an orphan is
re-parented to its nearest subreaper ancestor instead of init.

* The worker (:func:`end_descendants`, after every job, before its result is sent): every
  descendant of the worker (the job's processes and the daemons re-parented to it) is killed
  with SIGKILL and reaped, round after round until none is left (a process forking while it is
  killed leaves an orphan that lands on the worker and is found in the next round).
* The pool (:func:`sweep_orphans`): a worker the pool kills goes with its whole tree (walked
  while the worker lives, daemons included as they are the worker's children); the orphans of a
  worker that died first land on the pool, which kills (and reaps) every child of its own that
  is not a live worker, when a worker's exit is handled, every housekeeping tick and at shutdown.

Used by: ``context/worker.py`` (subreaper at start, :func:`end_descendants` per job) and
``pool/handle.py`` / ``pool/service.py`` (subreaper in ``Pool.serve``, :func:`sweep_orphans`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Collection

from ..procutil import children, proc_state, start_time, tree

PR_SET_CHILD_SUBREAPER = 36

#: a process named so that a reused pid is never mistaken for it: (pid, start time in ticks)
ProcId = tuple[int, int | None]


#: processes this worker keeps across jobs besides its own start-up's (an evaluation judge's zygote
#: and spare): :func:`keep`, read by the worker's end-of-job sweep
_KEPT: set[ProcId] = set()


def keep(proc: ProcId) -> None:
    """Spare ``proc`` (and its descendants) from the end-of-job sweep until :func:`unkeep`."""
    _KEPT.add(proc)


def unkeep(pid: int) -> None:
    for proc in [p for p in _KEPT if p[0] == pid]:
        _KEPT.discard(proc)


def kept() -> list[ProcId]:
    """What :func:`keep` spares, those that still exist."""
    for proc in [p for p in _KEPT if start_time(p[0]) != p[1]]:
        _KEPT.discard(proc)
    return sorted(_KEPT)


def reap_any_except(skip: Collection[int]) -> None:
    """Reap this process's exited children, except ``skip`` (children a ``Popen`` waits for)."""
    for pid in children(os.getpid()):
        if pid not in skip and proc_state(pid) == "Z":
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


def become_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans; False where the kernel refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def live(pid: int) -> bool:
    """The process exists and is not a zombie."""
    return proc_state(pid) not in (None, "Z")


def ident(pid: int) -> ProcId:
    return pid, start_time(pid)


def reap_any() -> None:
    """Reap every child of this process that has exited (the worker: no child of it is kept)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def reap(pids: Collection[int]) -> None:
    """Reap these children if they have exited (never a ``waitpid(-1)``: the pool's workers are
    reaped by their ``Popen``, which must still see their exit status)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _kill(pids: Collection[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def end_descendants(spare: Collection[ProcId] = (), timeout: float = 2.0) -> list[int]:
    """SIGKILL and reap every descendant of this process except ``spare`` (and theirs).

    Returns the pids still alive after ``timeout`` (a process stuck in uninterruptible sleep):
    the caller cannot vouch for the worker any more."""
    me = os.getpid()
    keep = set(spare)
    deadline = time.monotonic() + timeout
    while True:
        reap_any()
        kept = {pid for pid, st in keep if start_time(pid) == st}
        found = [p for p in tree_without(me, kept) if p != me]
        alive = [p for p in found if live(p)]
        if not alive:
            return []
        if time.monotonic() > deadline:
            return alive
        _kill(alive)
        time.sleep(0.001)


def tree_without(root: int, skip: Collection[int]) -> list[int]:
    """``root`` and its descendants, not descending into ``skip``."""
    found = [root]
    seen = {root}
    i = 0
    while i < len(found):
        for c in children(found[i]):
            if c not in seen and c not in skip:
                seen.add(c)
                found.append(c)
        i += 1
    return found


def sweep_orphans(keep: Collection[int], spare: Collection[ProcId] = ()) -> list[int]:
    """Kill (SIGKILL, whole tree) every child of this process not in ``keep`` (live workers) nor
    ``spare``, and reap the ones that have exited. Returns the pids it signalled."""
    me = os.getpid()
    spared = {pid for pid, st in spare if start_time(pid) == st}
    strays = [c for c in children(me) if c not in keep and c not in spared]
    killed: list[int] = []
    for child in strays:
        if not live(child):
            continue
        pids = [p for p in tree(child) if live(p)]
        _kill(pids[::-1])  # the deepest first: nothing is left to fork a new orphan
        killed.extend(pids)
    reap(strays)
    return killed


def sweep_until_clean(keep: Collection[int], spare: Collection[ProcId] = (), timeout: float = 3.0) -> list[int]:
    """:func:`sweep_orphans` until no stray child is left (or ``timeout``); returns the stray pids left."""
    deadline = time.monotonic() + timeout
    me = os.getpid()
    while True:
        sweep_orphans(keep, spare)
        spared = {pid for pid, st in spare if start_time(pid) == st}
        left = [c for c in children(me) if c not in keep and c not in spared]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.005)
