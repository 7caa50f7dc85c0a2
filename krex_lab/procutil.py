"""Small, exact views of Linux processes (through /proc and psutil).

KREX signals and re-pins other processes, so it must name them precisely: a pid plus its
start time (pid reuse), the state letter (never lock or re-stop a stopped process), whole
trees (compiler children included) and every thread.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterable

import psutil


def _read(path: str, whole: bool = False) -> bytes | None:
    """A small /proc file (os-level: Python's buffered ``open`` costs more than the read itself,
    and a region reads thousands of these). One read of a page, which holds a stat line;
    ``whole`` reads on to the end (a children list can be longer)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = [os.read(fd, 4096)]
        while whole and chunks[-1]:
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _after_comm(raw: bytes) -> bytes:
    """A stat line from its state on: "STATE PPID ..." (comm, field 2, may hold spaces and
    parentheses, so it ends at the *last* ')'); empty if the line is cut short."""
    return raw[raw.rfind(b")") + 2 :]


def _stat(pid: int) -> bytes | None:
    """The text after comm in /proc/PID's stat (see :func:`_after_comm`)."""
    # The task-level file: /proc/PID/stat sums over every thread of the group, so reading it for
    # each of a process's N threads costs O(N^2) (0.27 ms a read beside 3000 threads, 0.01 here).
    raw = _read(f"/proc/{pid}/task/{pid}/stat")
    if raw is None:  # a group whose leader thread has exited
        raw = _read(f"/proc/{pid}/stat")
    return _after_comm(raw) if raw else None


def _stat_fields(pid: int) -> list[str] | None:
    rest = _stat(pid)
    # [0] state, [19] start (ticks); nothing after the start time is read
    return rest.decode(errors="replace").split(maxsplit=20) if rest else None


def open_stat(pid: int) -> int | None:
    """A descriptor of the process's task-level stat file, for :func:`read_stat` (re-reading through
    it skips the path lookup that dominates a /proc read); None if the process is gone or no
    descriptor is left."""
    try:
        return os.open(f"/proc/{pid}/task/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def read_stat(fd: int) -> tuple[str | None, int | None]:
    """State letter and start time through a descriptor from :func:`open_stat` (None, None once
    the process is gone)."""
    try:
        raw = os.pread(fd, 4096, 0)
    except OSError:
        return None, None
    fields = _after_comm(raw).split(maxsplit=20)
    if len(fields) <= 19:
        return None, None
    return chr(fields[0][0]), int(fields[19])


def read_state(fd: int) -> str | None:
    """Only the state letter, through a descriptor from :func:`open_stat` (None once gone)."""
    try:
        raw = os.pread(fd, 4096, 0)
    except OSError:
        return None
    rest = _after_comm(raw)
    return chr(rest[0]) if rest and b")" in raw else None


def flags_and_start(pid: int) -> tuple[int | None, int | None]:
    """The kernel's task flags (field 9 of stat: PF_KTHREAD and the like) and the start time, from
    one read; (None, None) if gone."""
    fields = _stat_fields(pid)
    if not fields or len(fields) <= 19 or not fields[6].isdigit():
        return None, None
    return int(fields[6]), int(fields[19])


def proc_state(pid: int) -> str | None:
    """The one-letter state of /proc/PID/stat (R, S, D, T, t, Z, ...), None if gone."""
    rest = _stat(pid)
    return chr(rest[0]) if rest else None


#: the stat states of a process stopped by a signal (T) or a tracer (t)
STOPPED = ("T", "t")
#: the stat states of a process that has exited (zombie, dead): nothing of it runs any more
GONE = ("Z", "X")


def proc_is_stopped(pid: int) -> bool:
    """True if the process is stopped by a signal (T) or a tracer (t)."""
    return proc_state(pid) in STOPPED


def start_time(pid: int) -> int | None:
    """Start time in clock ticks since boot: with the pid, a name that pid reuse cannot fake."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def state_and_start(pid: int) -> tuple[str | None, int | None]:
    """State letter and start time from one read of /proc/PID/stat."""
    fields = _stat_fields(pid)
    if not fields or len(fields) <= 19:
        return None, None
    return fields[0], int(fields[19])


def same_process(pid: int, start: int | None) -> bool:
    """The process ``pid`` exists and is the one that started at ``start``."""
    return start is not None and start_time(pid) == start


def proc_uid(pid: int) -> int | None:
    """Real uid of the process, None if it is gone."""
    try:
        return psutil.Process(pid).uids().real
    except psutil.Error:
        return None


def real_and_effective_uid(pid: int) -> tuple[int | None, int | None]:
    """(real, effective) uid of the process, (None, None) if it is gone."""
    try:
        uids = psutil.Process(pid).uids()
    except psutil.Error:
        return None, None
    return uids.real, uids.effective


def node_task_count() -> int:
    """Threads of the whole node, kernel ones included (the total of /proc/loadavg's
    "running/total"): one read, to decide whether a node-wide walk belongs off the event loop."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return int(f.read().split()[3].split(b"/")[1])
    except (OSError, IndexError, ValueError):
        return 1 << 30  # unknown: assume a big node


def task_count(pids: Iterable[int]) -> int:
    """Threads of these processes, from one ``stat`` each (a task dir has two links plus one per
    thread): cheap enough to decide, per region, whether thread work belongs off the event loop."""
    n = 0
    for pid in pids:
        try:
            n += os.stat(f"/proc/{pid}/task").st_nlink - 2
        except OSError:
            continue
    return n


def parent_pid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields and len(fields) > 1 else None


def boot_ticks() -> int:
    """Now, in the unit of :func:`start_time` (clock ticks since boot)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def children(pid: int) -> list[int]:
    """Direct children of ``pid``, from /proc/PID/task/TID/children (no scan of all processes)."""
    if not _HAS_CHILDREN_FILE:
        try:
            return [c.pid for c in psutil.Process(pid).children()]
        except psutil.Error:
            return []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    return _children_of_tasks(pid, tids)


def _children_of_tasks(pid: int, tids: list[str]) -> list[int]:
    kids: list[int] = []
    for raw in _CHILDREN.read(pid, tids):
        if raw:
            kids.extend(map(int, raw.split()))
    return kids


class _ChildrenFiles:
    """Kept descriptors of the threads' children files of processes that trees are walked through.

    A region walks every sibling's tree at its freeze and again once the stops have landed, one
    children file a thread: 270 opens for 15 torch processes cost 1.2 ms on the H200 (gVisor),
    re-reading kept descriptors 0.17 ms (benchmarks/proc_cost.py, 2026-12-02). A descriptor
    names its task for good (once the task is gone it reads as empty, never as another's), so
    what must be guarded against is a pid or tid naming another task than when it was opened:
    a process is kept with a pidfd, whose signal 0 fails once it has ended (its pid may be
    anyone's then), and each thread's descriptor is opened anew after ``TTL`` seconds (a tid
    reused inside one living process would take the kernel's whole pid space meanwhile).
    Where pidfds are not given, or beyond ``LIMIT`` descriptors, files are opened each time.
    """

    LIMIT = 2048
    TTL = 10.0
    #: how often processes that ended (or were not walked for SWEEP seconds) are let go
    SWEEP = 30.0

    def __init__(self) -> None:
        self._procs: dict[int, tuple[int, dict[str, tuple[int, float]]]] = {}  # pid -> (pidfd, tid -> (fd, opened))
        self._used: dict[int, float] = {}
        self._count = 0
        self._swept = time.monotonic()
        self._lock = threading.Lock()  # the loop and the isolation thread walk trees
        self._pidfds = hasattr(os, "pidfd_open")

    def read(self, pid: int, tids: list[str]) -> list[bytes | None]:
        with self._lock:  # held over the reads: a descriptor must not be closed (and reused) meanwhile
            if time.monotonic() - self._swept > self.SWEEP:
                self._sweep()
            kept = self._process(pid)
            if kept is None:
                return [_read(f"/proc/{pid}/task/{tid}/children", whole=True) for tid in tids]
            now = time.monotonic()
            files = kept[1]
            for tid in [t for t in files if t not in tids]:  # exited threads
                self._close(files.pop(tid)[0])
            out: list[bytes | None] = []
            for tid in tids:
                fd, opened = files.get(tid, (-1, now))
                if fd >= 0 and now - opened > self.TTL:
                    self._close(files.pop(tid)[0])
                    fd = -1
                if fd < 0 and self._count < self.LIMIT:
                    fd = self._open(f"/proc/{pid}/task/{tid}/children")
                    if fd >= 0:
                        files[tid] = (fd, now)
                if fd < 0:
                    out.append(_read(f"/proc/{pid}/task/{tid}/children", whole=True))
                    continue
                try:
                    raw = os.pread(fd, 65536, 0)
                except OSError:
                    raw = None
                if raw is not None and len(raw) == 65536:  # a list longer than one read: read it whole
                    raw = _read(f"/proc/{pid}/task/{tid}/children", whole=True)
                out.append(raw)
            self._used[pid] = now
            return out

    def _sweep(self) -> None:
        now = self._swept = time.monotonic()
        for pid in [p for p, used in self._used.items() if now - used > self.SWEEP]:
            self._forget(pid)

    def _process(self, pid: int) -> tuple[int, dict[str, tuple[int, float]]] | None:
        """The kept entry of ``pid``, checked to be the same process (None: do not keep)."""
        kept = self._procs.get(pid)
        if kept is not None:
            try:
                signal.pidfd_send_signal(kept[0], 0)
                return kept
            except OSError:  # it ended: its descriptors name nothing any more
                self._forget(pid)
        if not self._pidfds or self._count >= self.LIMIT:
            return None
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return None
        except OSError:  # no pidfds on this kernel (or no descriptors left): read each time
            self._pidfds = False
            return None
        self._count += 1
        self._procs[pid] = (pidfd, {})
        return self._procs[pid]

    def _open(self, path: str) -> int:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return -1
        self._count += 1
        return fd

    def _close(self, fd: int) -> None:
        os.close(fd)
        self._count -= 1

    def _forget(self, pid: int) -> None:
        self._used.pop(pid, None)
        pidfd, files = self._procs.pop(pid)
        for fd, _ in files.values():
            self._close(fd)
        self._close(pidfd)

    def clear(self) -> None:
        with self._lock:
            for pid in list(self._procs):
                self._forget(pid)


_CHILDREN = _ChildrenFiles()


_HAS_CHILDREN_FILE = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (parents first); empty if ``pid`` is gone.

    A region walks the trees of every session, so this reads only those processes' entries
    (CONFIG_PROC_CHILDREN) instead of scanning every process on the node as psutil would.
    """
    try:  # the root's own task list: one read that also says whether it still exists
        first = _children_of_tasks(pid, os.listdir(f"/proc/{pid}/task")) if _HAS_CHILDREN_FILE else None
    except OSError:
        return []
    if first is None and not os.path.exists(f"/proc/{pid}"):
        return []
    found = [pid]
    seen = {pid}
    i = 0
    while i < len(found):
        for c in first if i == 0 and first is not None else children(found[i]):
            if c not in seen:
                seen.add(c)
                found.append(c)
        i += 1
    return found


def ancestors(pid: int) -> list[int]:
    """Parents of ``pid`` up to init, nearest first."""
    chain: list[int] = []
    fields = _stat_fields(pid)
    while fields and len(fields) > 1:
        ppid = int(fields[1])
        if ppid <= 0 or ppid in chain:
            break
        chain.append(ppid)
        fields = _stat_fields(ppid)
    return chain


def tree_until(pid: int, stop: set[int]) -> list[int]:
    """``pid`` and its descendants, not descending into (nor including) the pids in ``stop``."""
    if not os.path.exists(f"/proc/{pid}"):
        return []
    found = [pid]
    i = 0
    while i < len(found):
        found.extend(c for c in children(found[i]) if c not in stop and c not in found)
        i += 1
    return found


def lineage(pid: int) -> set[int]:
    """The process, its descendants and its ancestors: what a region must never stop."""
    return set(tree(pid)) | set(ancestors(pid))


def threads(pids: Iterable[int]) -> list[int]:
    """Every thread id of the given processes (those that still exist)."""
    tids: list[int] = []
    for pid in pids:
        try:
            tids.extend(int(t) for t in os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
    return tids


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far."""
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system
