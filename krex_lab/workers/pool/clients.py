"""Which submitting processes are still alive: a pidfd per client process, read by the event loop.

A client that exits (a notebook kernel restarted, ``krex run`` killed) cannot say so; its jobs
and leases must end anyway, at once rather than at a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable


class ClientWatch:
    def __init__(self, gone: Callable[[int], None]) -> None:
        self._gone = gone
        self._fds: dict[int, int] = {}

    def watch(self, pid: int) -> None:
        """Call ``gone(pid)`` once when ``pid`` exits (no-op where pidfds are missing)."""
        if pid in self._fds or pid == os.getpid():
            return
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            return
        self._fds[pid] = fd

        def exited() -> None:
            self._forget(pid)
            self._gone(pid)

        asyncio.get_running_loop().add_reader(fd, exited)

    def _forget(self, pid: int) -> None:
        fd = self._fds.pop(pid, None)
        if fd is None:
            return
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(fd)
        with contextlib.suppress(OSError):
            os.close(fd)

    def close(self) -> None:
        for pid in list(self._fds):
            self._forget(pid)
