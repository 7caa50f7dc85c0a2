"""Small, exact views of Linux processes (through /proc and psutil).

KREX signals and re-pins other processes, so it must name them precisely: a pid plus its
start time (pid reuse), the state letter (never lock or re-stop a stopped process), whole
trees (compiler children included) and every thread.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable

import psutil

from .procfiles import KEPT, read_proc


def _after_comm(raw: bytes) -> bytes:
    """A stat line from its state on: "STATE PPID ..." (comm, field 2, may hold spaces and
    parentheses, so it ends at the *last* ')'); empty if the line is cut short."""
    return raw[raw.rfind(b")") + 2 :]


def _stat(pid: int, kept: bool = False) -> bytes | None:
    """The text after comm in /proc/PID's stat (see :func:`_after_comm`); ``kept``: through a kept
    descriptor (:mod:`krex_lab.procfiles`), for the processes every region reads again."""
    # The task-level file: /proc/PID/stat sums over every thread of the group, so reading it for
    # each of a process's N threads costs O(N^2) (0.27 ms a read beside 3000 threads, 0.01 here).
    raw = KEPT.read(pid, [f"task/{pid}/stat"])[0] if kept else read_proc(f"/proc/{pid}/task/{pid}/stat")
    if raw is None:  # a group whose leader thread has exited
        raw = read_proc(f"/proc/{pid}/stat")
    return _after_comm(raw) if raw else None


def _stat_fields(pid: int, kept: bool = False) -> list[str] | None:
    rest = _stat(pid, kept)
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


def state_and_threads(pid: int) -> tuple[str | None, int | None]:
    """State letter and thread count of a session root, through its kept stat file (None, None if
    gone). A stopped process makes no thread: its count then holds until it is continued."""
    raw = KEPT.read(pid, [f"task/{pid}/stat"])[0]
    if raw is None:  # a group whose leader thread has exited
        raw = read_proc(f"/proc/{pid}/stat")
    # read for every sibling at every grant: the bytes are split, nothing decoded
    fields = _after_comm(raw).split(maxsplit=18) if raw else []
    if len(fields) <= 17:
        return None, None
    return chr(fields[0][0]), int(fields[17])


def flags_and_start(pid: int) -> tuple[int | None, int | None]:
    """The kernel's task flags (field 9 of stat: PF_KTHREAD and the like) and the start time, from
    one read; (None, None) if gone."""
    fields = _stat_fields(pid)
    if not fields or len(fields) <= 19 or not fields[6].isdigit():
        return None, None
    return int(fields[6]), int(fields[19])


def proc_state(pid: int, kept: bool = False) -> str | None:
    """The one-letter state of /proc/PID/stat (R, S, D, T, t, Z, ...), None if gone (``kept``:
    see :func:`_stat`)."""
    rest = _stat(pid, kept)
    return chr(rest[0]) if rest else None


#: the stat states of a process stopped by a signal (T) or a tracer (t)
STOPPED = ("T", "t")
#: the stat states of a process that has exited (zombie, dead): nothing of it runs any more
GONE = ("Z", "X")


#: task flag of a process inside exit() (include/linux/sched.h): it still has a /proc entry and may
#: still be listed on a GPU while the driver tears its context down, but runs no more user code
PF_EXITING = 0x4


def exited_or_exiting(pid: int) -> bool:
    """Gone, a zombie, or inside exit(): nothing of it will submit GPU work again."""
    fields = _stat_fields(pid)
    if not fields or len(fields) <= 6 or fields[0] in GONE:
        return True
    return fields[6].isdigit() and bool(int(fields[6]) & PF_EXITING)


async def settle_exits(pids: Iterable[int], grace: float, step: float = 0.005) -> set[int]:
    """Those of ``pids`` that have exited or are exiting, each given up to ``grace`` seconds to
    get there (a process that ends while a region is acquired is gone, not a failure of it)."""
    left = set(pids)
    gone: set[int] = set()
    deadline = time.monotonic() + grace
    while True:
        now_gone = {p for p in left if exited_or_exiting(p)}
        gone |= now_gone
        left -= now_gone
        if not left or time.monotonic() >= deadline:
            return gone
        await asyncio.sleep(step)


def start_time(pid: int) -> int | None:
    """Start time in clock ticks since boot: with the pid, a name that pid reuse cannot fake."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def state_and_start(pid: int, kept: bool = False) -> tuple[str | None, int | None]:
    """State letter and start time from one read of /proc/PID/stat (``kept``: see :func:`_stat`)."""
    fields = _stat_fields(pid, kept)
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


def _children_of_tasks(pid: int, tids: list[str], kept: bool = False) -> list[int]:
    names = [f"task/{tid}/children" for tid in tids]
    raws = KEPT.read(pid, names) if kept else [read_proc(f"/proc/{pid}/{n}", whole=True) for n in names]
    kids: list[int] = []
    for raw in raws:
        if raw:
            kids.extend(map(int, raw.split()))
    return kids


_HAS_CHILDREN_FILE = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def tree(pid: int, kept: bool = False) -> list[int]:
    """``pid`` and all its descendants (parents first); empty if ``pid`` is gone.

    A region walks the trees of every session, so this reads only those processes' entries
    (CONFIG_PROC_CHILDREN) instead of scanning every process on the node as psutil would.
    ``kept``: the root's files through kept descriptors (procfiles), for the arbiter's freeze,
    which walks its siblings' trees twice every region (see :func:`session_tree`). Off for
    everyone else: a worker that runs user code must hold no descriptor the code could close.
    """
    if kept:
        return session_tree(pid)[0]
    try:  # the root's own task list: one read that also says whether it still exists
        first = _children_of_tasks(pid, os.listdir(f"/proc/{pid}/task")) if _HAS_CHILDREN_FILE else None
    except OSError:
        return []
    if first is None and not os.path.exists(f"/proc/{pid}"):
        return []
    return _descend(pid, first)


def session_tree(pid: int, stopped_threads: int | None = None) -> tuple[list[int], tuple[str, int] | None]:
    """A session root's tree, as :func:`tree`, and the root's (state, start time) from the same look.

    The root's stat and its leader thread's children come through kept descriptors in one read;
    a root of one thread (the stat says so) has no other children file, so its task list is not
    read (a listing costs four syscalls: the freeze's two walks of 63 sleeping siblings spent a
    third of the arbiter's time listing, ``benchmarks/regions/scale.py``, 2026-12-02). A session is a
    process the arbiter bounds, while its descendants are as many as a user makes: they are
    read afresh. ``([], None)`` if the root is gone.

    ``stopped_threads``: the root's thread count, read after it was seen stopped (by
    :func:`state_and_threads`); a stopped root of one thread is walked from its children file
    alone, with no state to return (and ``[pid]`` even if it has ended since). A root its owner
    continues meanwhile escapes the freeze anyway, as it always did.
    """
    if not _HAS_CHILDREN_FILE:
        return tree(pid), None
    task = f"task/{pid}/"
    if stopped_threads == 1:
        raw = KEPT.read(pid, [task + "children"], vouched=True)[0]
        # no children (a sibling's usual tree): nothing to descend into
        return (_descend(pid, [int(x) for x in raw.split()]) if raw else [pid]), None
    raw_stat, raw_kids = KEPT.read(pid, [task + "stat", task + "children"])
    fields = _after_comm(raw_stat).split(maxsplit=20) if raw_stat else []
    # no stat: gone, or a group whose leader thread exited (list what is left)
    stat = (chr(fields[0][0]), int(fields[19])) if len(fields) > 19 else None
    if stat is not None and fields[17] == b"1":
        return (_descend(pid, [int(x) for x in raw_kids.split()]) if raw_kids else [pid]), stat
    try:
        first = _children_of_tasks(pid, os.listdir(f"/proc/{pid}/task"), kept=True)
    except OSError:
        return [], None
    return _descend(pid, first), stat


def _descend(pid: int, first: list[int] | None) -> list[int]:
    """``pid`` and its descendants, given its own children (None: read them too)."""
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


def parent_state_start(pid: int, kept: bool = False) -> tuple[int, str | None, int | None]:
    """``pid``'s parent, state letter and start time from one stat read ((0, None, None) once it
    is gone); ``kept``: through a kept descriptor, as :func:`_stat` says."""
    fields = _stat_fields(pid, kept)
    if not fields or len(fields) < 20:
        return 0, None, None
    return int(fields[1]), fields[0][:1], int(fields[19])


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
