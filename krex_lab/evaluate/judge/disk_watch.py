"""The disk a candidate fills, watched from the judge: its build directory (the one place it may
write) and the files its processes hold open after removing them.

RLIMIT_FSIZE bounds one file; nothing in the sandbox bounds how many. Without a quota (none can
be assumed on the node's filesystem) the judge looks: every :data:`EVERY_S` seconds, while the
candidate's process lives, it adds up the blocks of the build directory's files and of the
removed files the candidate's processes still have open (``/proc/<pid>/fd``: a removed file
frees its blocks only once closed). Past the limit the candidate's processes are killed at once,
and the verdict says why (``disk_limit``). A file it writes and removes between two looks may
pass unseen; what it can keep is bounded. The open files of a non-dumpable process are root's to
read: a judge of an ordinary user counts the build directory alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import threading
from collections.abc import Callable, Iterator

__all__ = ["DiskWatch", "used_bytes"]

#: seconds between two looks at the candidate's disk use
EVERY_S = 0.25


def used_bytes(root: str, pids: list[int], cancelled: Callable[[], bool] = lambda: False) -> int | None:
    """Bytes on disk of the files under ``root`` and of the removed files ``pids`` hold open
    (each file once, however many names or descriptors it has); None once ``cancelled()`` (asked
    at every directory and every 256 files: a walk's length is the candidate's to choose)."""
    seen: set[tuple[int, int]] = set()
    total = 0

    def count(st: os.stat_result) -> None:
        nonlocal total
        key = (st.st_dev, st.st_ino)
        if stat.S_ISREG(st.st_mode) and key not in seen:
            seen.add(key)
            total += st.st_blocks * 512

    for top, _dirs, files in os.walk(root, onerror=lambda _: None):
        if cancelled():
            return None
        for i, name in enumerate(files, 1):
            if i % 256 == 0 and cancelled():
                return None
            with contextlib.suppress(OSError):
                count(os.lstat(os.path.join(top, name)))
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        with contextlib.suppress(OSError):
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):
                    if os.readlink(os.path.join(fd_dir, fd)).endswith(" (deleted)"):
                        count(os.stat(os.path.join(fd_dir, fd)))
    return total


class DiskWatch:
    """Looks at the candidate's disk use in a thread of its own until :meth:`stop`; past
    ``limit`` bytes kills ``pids()`` and keeps why in :attr:`breached`."""

    def __init__(self, root: str, pids: Callable[[], list[int]], limit: int) -> None:
        self.root, self.pids, self.limit = root, pids, limit
        #: why the candidate was killed (None: it was not)
        self.breached: str | None = None
        #: the most it was seen to use
        self.peak = 0
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="krex-disk-watch", daemon=True)

    def start(self) -> DiskWatch:
        if self.limit > 0:
            self._thread.start()
        return self

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No look inside the block (the timed rounds and the reference: the judge's walks would
        share the node's cores, and the judge's CPU time, with what is timed); a look under way
        is given up before the block starts (a candidate's tree of thousands of empty files once
        kept one walking through the reference's timing, and doubled its time); one look as it
        ends."""
        self._paused.set()
        with self._lock:  # the look under way has seen the flag and left
            pass
        try:
            yield
        finally:
            self._paused.clear()
            if self.limit > 0 and self._thread.is_alive():
                self._look()

    def stop(self) -> None:
        """The last look, with the candidate's processes still alive; then no more."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
            if self.breached is None:
                self._look()

    def _run(self) -> None:
        while not self._stop.wait(EVERY_S):
            if not self._paused.is_set() and self._look(self._paused.is_set):
                return

    def _look(self, cancelled: Callable[[], bool] = lambda: False) -> bool:
        """Whether the candidate is past its limit (then killed, and :attr:`breached` says so)."""
        with self._lock:
            if self.breached is not None:
                return True
            pids = self.pids()
            used = used_bytes(self.root, pids, cancelled)
            if used is None:
                return False
            self.peak = max(self.peak, used)
            if used <= self.limit:
                return False
            self.breached = (
                f"the candidate used {used / 2**20:.0f} MiB of disk (its build directory and the removed "
                f"files it held open), more than its limit of {self.limit / 2**20:.0f} MiB"
            )
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            return True
