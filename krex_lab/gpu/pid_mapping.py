"""Which process NVML means: its pid in our namespace, checked, and kept for the process's life.

NVML reports pids as the driver recorded them, i.e. in the pid namespace of the host, while the
arbiter signals and locks pids of *its own* namespace. :func:`local_pid` maps one to the other
through the ``NSpid`` line of /proc/PID/status, which lists a process's pid in every namespace
from the one that mounted /proc down to its own; :func:`holds_nvidia_device` rejects a pid that
names a bystander; :class:`PidMap` keeps both answers for the process's life.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..procutil import start_time

PROC = Path("/proc")


def parse_nspid(status_text: str) -> list[int]:
    """The pids of the ``NSpid:`` line of a /proc/PID/status text, outermost first ([] if none)."""
    for line in status_text.splitlines():
        if line.startswith("NSpid:"):
            return [int(x) for x in line.split()[1:]]
    return []


def _nspid(entry: str, proc: Path) -> list[int] | None:
    try:
        return parse_nspid((proc / entry / "status").read_text())
    except (OSError, ValueError):
        return None


@functools.lru_cache(maxsize=8)
def _own_depth(proc: Path, pid: int) -> int:
    """How many pid namespaces below /proc's process ``pid`` (ourselves) is: fixed for its life,
    so asked once (a drain maps every GPU process, a status read costs tens of microseconds). The
    pid is in the key so that a forked child, perhaps in a new namespace, asks again."""
    return len(_nspid("self", proc) or [pid]) - 1


def local_pid(nvml_pid: int, proc: Path = PROC) -> int | None:
    """The pid by which this process can signal/lock the process NVML calls ``nvml_pid``.

    Reasoning: /proc shows every process by its pid in the namespace that mounted /proc, and
    its ``NSpid`` line continues with its pid in each nested namespace. Our own line tells our
    depth ``d`` below that namespace (``NSpid: 4242 1`` -> d = 1), so the process seen at
    /proc/<nvml_pid> is known to us by entry ``d`` of its line. A process whose line is
    shorter lives outside our namespace, and we cannot address it: ``None``.

    This assumes /proc was mounted by the namespace whose pids NVML reports (the host's). In a
    container with its own /proc, host pids are not visible at all: /proc/<nvml_pid> is then
    either missing (``None``) or an unrelated process; :func:`holds_nvidia_device` is the
    check that rejects the latter. Kernels without ``NSpid`` (< 4.1) map pids to themselves.
    """
    theirs = _nspid(str(nvml_pid), proc)
    if theirs is None:
        return None
    depth = _own_depth(proc, os.getpid())
    if not theirs:
        return nvml_pid
    if len(theirs) <= depth:
        return None
    return theirs[depth]


def holds_nvidia_device(pid: int, proc: Path = PROC) -> bool | None:
    """Whether ``pid`` has a /dev/nvidia* file open (every CUDA context does); None if unknown."""
    try:
        with os.scandir(proc / str(pid) / "fd") as fds:
            for fd in fds:
                try:
                    if os.readlink(fd.path).startswith("/dev/nvidia"):
                        return True
                except OSError:
                    continue  # closed meanwhile
    except PermissionError:
        return None  # another user's process, and we are not root: cannot tell
    except OSError:
        return False  # gone
    return False


class PidMap:
    """NVML pid -> our pid (:func:`local_pid`, checked with :func:`holds_nvidia_device`), kept for
    the process's life. Both answers are fixed while the process lives, and a drain asks for
    every GPU process: a status read and a scan of every descriptor (0.6-0.8 ms for 15 torch
    processes, lock_cost.py, H200, 2026-12-02) become one check that the process is still the
    one mapped: a signal 0 through a pidfd, which fails once it has ended, or where pidfds are
    not given (gVisor), its start time. Only for the real /proc: a stand-in's pids name no
    process of ours."""

    #: entries not listed for this long are dropped (their pidfds closed)
    FORGET_AFTER = 60.0

    @dataclass
    class _Entry:
        pid: int  # ours
        fd: int  # a pidfd, or -1: then ``start`` tells the process
        start: int
        seen: float

    def __init__(self, proc: Path) -> None:
        self._proc = proc
        self._keep = proc == PROC
        self._known: dict[int, PidMap._Entry] = {}  # by NVML pid
        self._lock = threading.Lock()  # the drain (on the loop) and the region's watcher (a thread)

    def lookup(self, nvml_pid: int) -> int | None:
        now = time.monotonic()
        with self._lock:
            hit = self._known.get(nvml_pid)
            if hit is not None:
                if self._same(hit):
                    hit.seen = now
                    return hit.pid
                self._drop(nvml_pid)  # it ended: whoever has the pid now is asked afresh
        mine = local_pid(nvml_pid, self._proc)
        # A pid that /proc names but that holds no NVIDIA device is a namespace collision,
        # not the GPU process NVML meant: never lock or report a bystander.
        if mine is None or holds_nvidia_device(mine, self._proc) is False:
            return None
        if self._keep:
            start = start_time(mine)
            try:
                fd = os.pidfd_open(mine)
            except ProcessLookupError:
                return mine  # gone already: nothing to keep
            except OSError:  # no pidfds here: the start time tells the process
                fd = -1
            if start is None or (fd >= 0 and start_time(mine) != start):
                if fd >= 0:  # the pid changed hands between the two reads: ask again next time
                    os.close(fd)
                return mine
            with self._lock:
                self._drop(nvml_pid)
                self._known[nvml_pid] = PidMap._Entry(mine, fd, start, now)
        return mine

    @staticmethod
    def _same(entry: PidMap._Entry) -> bool:
        if entry.fd < 0:
            return start_time(entry.pid) == entry.start
        try:
            signal.pidfd_send_signal(entry.fd, 0)
            return True
        except OSError:
            return False

    def _drop(self, nvml_pid: int) -> None:
        entry = self._known.pop(nvml_pid, None)
        if entry is not None and entry.fd >= 0:
            os.close(entry.fd)

    def sweep(self) -> None:
        """Drop what no listing has named for :attr:`FORGET_AFTER` seconds."""
        cutoff = time.monotonic() - self.FORGET_AFTER
        with self._lock:
            for k in [k for k, e in self._known.items() if e.seen < cutoff]:
                self._drop(k)

    def close(self) -> None:
        with self._lock:
            for k in list(self._known):
                self._drop(k)
