"""Kept descriptors of the /proc files that every region reads again.

A region reads the same files of the same processes each time: every sibling's stat and cgroup
(the drain's checks before each lock) and each thread's children file (the freeze's tree walks,
twice). Opening a /proc file costs most of reading it: 270 children files of 15 torch processes
took 1.2 ms opened and 0.17 ms re-read through kept descriptors on the H200, whose kernel is
gVisor (benchmarks/probes/proc_cost.py, 2026-12-02). :class:`KeptFiles` keeps them.

What a kept descriptor reads is always the file as it is now, of the task it was opened on;
once that task is gone it reads as empty or fails, never as another task's. What must be
guarded against is a pid or tid naming another task than when the file was opened:

* a process is kept with a pidfd, whose signal 0 fails once the process has ended (its pid may
  be anyone's then): its descriptors are all let go before anything is read. A look that starts
  with the stat file skips the signal while that file reads as a live process's: a descriptor of
  an ended process fails or reads a zombie's stat, never another process's;
* a thread's files (``task/TID/...``) are opened anew after :attr:`KeptFiles.TTL` seconds: a
  tid reused inside one living process would take the kernel's whole pid space meanwhile (the
  leader's, ``task/PID/...``, are not: its tid stays taken while the process lives).

Where the kernel gives no pidfds, beyond :attr:`KeptFiles.limit` descriptors in all or
:attr:`KeptFiles.PER_PROCESS` for one process, files are opened and closed each time, as
:func:`read_proc` does. Only the processes a region names are kept (session roots, GPU
processes), never what a user can multiply at will (a tree's descendants): a user's 200
children held 400 descriptors of the arbiter before that bound (tests/security). The session
capacity reserves :attr:`KeptFiles.limit` (``arbiter/quotas.py``, which sets it from the
descriptor limit: every session root keeps three or four files), and a session's files go when it
ends (:meth:`KeptFiles.forget`).
"""

from __future__ import annotations

import os
import signal
import threading
import time


def read_proc(path: str, whole: bool = False) -> bytes | None:
    """A small /proc file (os-level: Python's buffered ``open`` costs more than the read itself).
    One read of a page, which holds a stat line; ``whole`` reads on to the end (a children list
    can be longer). None if it cannot be opened (the process is gone)."""
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


class KeptFiles:
    """Descriptors of /proc/PID/NAME files, kept per process (see the module's docstring)."""

    #: descriptors kept in all, unless the owner sets :attr:`limit` (the arbiter does)
    LIMIT = 512
    #: files kept for one process (its pidfd aside): a process of many threads has the rest read
    PER_PROCESS = 64
    #: seconds after which a thread's file is opened anew
    TTL = 10.0
    #: processes not read for this long are let go (checked at most this often)
    SWEEP = 30.0
    _PAGE = 65536

    def __init__(self) -> None:
        # pid -> (pidfd, name -> (fd, opened)); when each process was last read
        self._procs: dict[int, tuple[int, dict[str, tuple[int, float]]]] = {}
        self._used: dict[int, float] = {}
        self._count = 0
        self._swept = time.monotonic()
        # Held over the reads: a descriptor must not be closed (and its number reused) while
        # another thread reads it. The event loop and the isolation thread both read.
        self._lock = threading.Lock()
        self._pidfds = hasattr(os, "pidfd_open")
        self.limit = self.LIMIT

    def read(self, pid: int, names: list[str], vouched: bool = False) -> list[bytes | None]:
        """Each ``/proc/PID/NAME`` as it is now (None where it cannot be read). ``vouched``: the
        caller has just seen the process alive and stopped (its stop made through a pidfd), so
        files it already keeps are read unchecked: a descriptor of a process that has ended since
        reads as empty, never as another's. Files not kept yet are read the checked way."""
        # Every region calls this a few times for each sibling: the kept paths below allocate
        # and format nothing they do not need.
        with self._lock:
            now = time.monotonic()
            if now - self._swept > self.SWEEP:
                self._sweep(now)
            kept = self._procs.get(pid)
            if kept is not None:
                files = kept[1]
                # Only descriptors kept from before can vouch: a file opened now, by path, may be
                # a new process's under a reused pid.
                if vouched and all(n in files for n in names):
                    self._used[pid] = now
                    return [self._read(pid, files, name, now) for name in names]
                first_name = names[0] if names else ""
                if first_name in files and (first_name == "stat" or first_name == f"task/{pid}/stat"):
                    # A stat line read first vouches for the process: a kept descriptor of one that
                    # has ended fails to read, or reads it as a zombie, never as another process.
                    # Only then is the pidfd asked (one syscall less on every look of a live process).
                    first = self._read(pid, files, first_name, now)
                    state = first[first.rfind(b")") + 2 :][:1] if first is not None else b""
                    if state not in (b"Z", b"X", b""):
                        self._used[pid] = now
                        if len(names) == 1:
                            return [first]
                        return [first, *(self._read(pid, files, name, now) for name in names[1:])]
            kept = self._process(pid)
            if kept is None:
                return [read_proc(f"/proc/{pid}/{name}", whole=True) for name in names]
            self._used[pid] = now
            return [self._read(pid, kept[1], name, now) for name in names]

    def _read(self, pid: int, files: dict[str, tuple[int, float]], name: str, now: float) -> bytes | None:
        entry = files.get(name)
        if entry is not None:
            fd, opened = entry
            # A thread's tid may come back within its process; the leader's (tid = pid) cannot
            # while the process lives, so its files need no reopening (a reopening goes by path).
            if now - opened <= self.TTL or not name.startswith("task/") or name.startswith(f"task/{pid}/"):
                try:
                    # a stat line fits a page; a children list may be long
                    raw = os.pread(fd, 4096 if name.endswith("stat") else self._PAGE, 0)
                except OSError:
                    return None
                # A file longer than one read (a children list of thousands) is read whole, afresh.
                return read_proc(f"/proc/{pid}/{name}", whole=True) if len(raw) == self._PAGE else raw
            self._close(files.pop(name)[0])
        path = f"/proc/{pid}/{name}"
        if self._count < self.limit and len(files) < self.PER_PROCESS:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            self._count += 1
            files[name] = (fd, now)
            try:
                raw = os.pread(fd, self._PAGE, 0)
            except OSError:
                return None
            return read_proc(path, whole=True) if len(raw) == self._PAGE else raw
        return read_proc(path, whole=True)

    def _process(self, pid: int) -> tuple[int, dict[str, tuple[int, float]]] | None:
        """The kept entry of ``pid``, checked to be the same process (None: do not keep)."""
        kept = self._procs.get(pid)
        if kept is not None:
            try:
                signal.pidfd_send_signal(kept[0], 0)
                return kept
            except OSError:  # it ended: its descriptors name nothing any more
                self._forget(pid)
        if not self._pidfds or self._count >= self.limit:
            return None
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return None
        except OSError as exc:
            if exc.errno != 24:  # EMFILE passes; anything else: no pidfds on this kernel
                self._pidfds = False
            return None
        self._count += 1
        self._procs[pid] = (pidfd, {})
        return self._procs[pid]

    def _close(self, fd: int) -> None:
        os.close(fd)
        self._count -= 1

    def _forget(self, pid: int) -> None:
        self._used.pop(pid, None)
        pidfd, files = self._procs.pop(pid)
        for fd, _ in files.values():
            self._close(fd)
        self._close(pidfd)

    def _sweep(self, now: float) -> None:
        self._swept = now
        for pid in [p for p, used in self._used.items() if now - used > self.SWEEP]:
            self._forget(pid)
        for pid in [p for p in self._procs if p not in self._used]:
            self._forget(pid)

    def forget(self, pid: int) -> None:
        """Let ``pid``'s files go now (its session ended: the arbiter knows before any sweep)."""
        with self._lock:
            if pid in self._procs:
                self._forget(pid)

    def kept(self, pid: int) -> bool:
        """Whether ``pid``'s files are kept now (for tests and benchmarks)."""
        with self._lock:
            return pid in self._procs

    def clear(self) -> None:
        with self._lock:
            for pid in list(self._procs):
                self._forget(pid)


#: the one cache of this process: the region sequence's reads of the siblings' files
KEPT = KeptFiles()
