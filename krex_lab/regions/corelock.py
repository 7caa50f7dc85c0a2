"""One arbiter at a time reserves cores on a node.

A :class:`~krex_lab.regions.isolate.CoreBook` remembers each thread's original affinity the first
time one of *its* regions moves it, and restores it at release. Two arbiters on one node (two
runtime directories, a Ray cluster simulated on one machine, a developer's lab beside the test
suite) each keep a book, and their regions can overlap: the second records as "original" what the
first had narrowed, the first restores, the second then restores the narrowed mask -- and a process
(PID 1 included, in ``affinity`` shield mode) is left pinned for good. So the cores of a node are
reserved under one ``flock``: the first region of a book takes it, the book's last release gives
it back, and a region of another arbiter that finds it taken gets no cores and says why (its
report is degraded) instead of corrupting the other's book. The kernel drops the lock when its
holder dies, so a crashed arbiter never blocks the node.

The lock lives where only its user can create it: ``/run`` for root, else ``$XDG_RUNTIME_DIR``
(or ``/run/user/UID``), else the temporary directory with the uid in its name. A file there that
is not a regular file of this user is refused, not followed. Arbiters of *different* users use
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
    book calls it under its own lock."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else default_path()
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> str:
        """Take the lock without waiting; returns "" or why not (another arbiter holds it, or the
        lock file cannot be trusted)."""
        if self._fd is not None:
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
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            return f"another KREX arbiter on this node (pid {holder}) holds reserved cores"
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return ""

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the only descriptor drops the flock
