"""One arbiter at a time reserves cores on a node.

A :class:`~krex_lab.enforcement.isolate.CoreBook` remembers each thread's original affinity the first
time one of *its* regions moves it, and restores it at release. Two arbiters on one node (two
runtime directories, a Ray cluster simulated on one machine, a developer's lab beside the test
suite) each keep a book, and their regions can overlap: the second records as "original" what the
first had narrowed, the first restores, the second then restores the narrowed mask -- and a process
(PID 1 included, in ``affinity`` shield mode) is left pinned for good. So the cores of a node are
reserved under one ``flock``: the first region of a book takes it, the book's last release gives
it back, and a region of another arbiter that finds it taken gets no cores and says why (its
report is degraded) instead of corrupting the other's book. A crashed arbiter's lock is held by
its guardian until the guardian has undone the crash, then dropped (the kernel drops it when
both are gone), so a crash never blocks the node for longer than the undo.

The lock lives where only its user can create it: ``/run`` for root, else ``$XDG_RUNTIME_DIR``
(or ``/run/user/UID``), else the temporary directory with the uid in its name. A file there that
is not a regular file of this user is refused, not followed; one that others may open (and so
hold) is replaced by a fresh one only this user can open. Arbiters of *different* users use
different locks; a root arbiter in ``affinity`` mode beside a user's arbiter is not coordinated.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
from pathlib import Path

NAME = "krex-cores.lock"


def default_path() -> Path:
    uid = os.geteuid()
    if uid == 0 and os.access("/run", os.W_OK):
        return Path("/run") / NAME
    for candidate in (os.environ.get("XDG_RUNTIME_DIR", ""), f"/run/user/{uid}"):
        if candidate and _own_private_dir(candidate, uid):
            return Path(candidate) / NAME
    return Path(tempfile.gettempdir()) / f"krex-cores-{uid}.lock"


def _own_private_dir(path: str, uid: int) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o022


class NodeCoreLock:
    """The node's core reservation lock (see the module docstring). Not thread-safe: the core
    book calls it under its own lock.

    The file stays open from :meth:`open` on and the lock is taken and dropped on that one open
    file description, which the arbiter shares with its guardian (:attr:`fd`, passed at spawn):
    if the arbiter dies holding it, the lock stays held until the guardian has restored what the
    arbiter had narrowed and lets it go -- no other arbiter can reserve cores in between.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else default_path()
        self.fd: int | None = None
        self.held = False

    def open(self) -> str:
        """Open (and check) the lock file without locking it; returns "" or why it cannot be used."""
        if self.fd is not None:
            return ""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return f"the core lock {self.path} is a symlink: refused"
            return f"cannot open the core lock {self.path}: {exc.strerror}"
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            return f"the core lock {self.path} is not this user's file: refused"
        if st.st_mode & 0o077:
            # Others may open it (an admin's touch under umask 022): anyone could hold it and keep
            # every region of the node from its cores, through a descriptor opened before any
            # chmod. A fresh file that only this user can open; an old descriptor locks nothing.
            os.close(fd)
            try:
                os.unlink(self.path)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                return f"cannot replace the core lock {self.path}, which others may open: {exc.strerror}"
        self.fd = fd
        return ""

    def acquire(self) -> str:
        """Take the lock without waiting; returns "" or why not (another arbiter holds it, or the
        lock file cannot be trusted)."""
        if self.held:
            return ""
        why = self.open()
        if why or self.fd is None:
            return why
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 32, 0).decode(errors="replace").strip() or "?"
            return f"another KREX arbiter on this node (pid {holder}) holds reserved cores"
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        self.held = True
        return ""

    def release(self) -> None:
        if not self.held or self.fd is None:
            return
        self.held = False
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)
        fcntl.flock(self.fd, fcntl.LOCK_UN)  # for every holder of the description, the guardian too

    def close(self) -> None:
        self.release()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def let_go(fd: int) -> None:
    """The guardian's end of a dead arbiter's lock: drop it (after the undo) and close."""
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    with contextlib.suppress(OSError):
        os.close(fd)
