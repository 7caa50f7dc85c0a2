"""Worker side: limits and watches around a candidate's code, undone when it returns.

* :class:`CapturedOutput`: fd 1 and 2 go to a file of the evaluation's build directory, at most
  ``limit`` bytes (``RLIMIT_FSIZE``; a write past it fails in the candidate with EFBIG), so a
  flood never crosses the pool's pipes to the caller; the head and the tail are kept. The
  faulthandler still writes to the worker's own stderr, so a segfault's stack reaches the pool.
* :func:`memory_limit`: ``RLIMIT_DATA`` lowered to what the process uses plus the allowance, so
  an allocation past it fails (MemoryError, torch's "can't allocate memory") instead of the
  kernel's OOM killer choosing a victim on a shared node. Raised back afterwards (a soft limit
  may go back up to the hard one). GPU memory is the framework's own: its OOM is an exception.
* :class:`ReferenceTrap`: any Python call into the reference's file while the candidate runs
  (an imported, re-executed or inherited reference) is recorded: such a candidate is rejected.
* :class:`ThreadWatch`: threads the candidate started and left running when its call returned
  (work a timer around the call would not see).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import resource
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

__all__ = ["CapturedOutput", "ReferenceTrap", "ThreadWatch", "memory_limit"]

_KEEP = 4096  # bytes of head and of tail kept of a candidate's output


class CapturedOutput:
    """fd 1 and 2 into ``path`` (appended) within the block, at most ``limit`` bytes."""

    def __init__(self, path: str, limit: int) -> None:
        self.path = path
        self.limit = limit
        self.bytes = 0
        self.limited = False

    def __enter__(self) -> CapturedOutput:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        self._saved = (os.dup(1), os.dup(2))
        self._fault = os.fdopen(os.dup(self._saved[1]), "w")
        faulthandler.enable(file=self._fault, all_threads=False)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self._start = os.fstat(fd).st_size
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        self._fsize = resource.getrlimit(resource.RLIMIT_FSIZE)
        self._xfsz = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, no signal
        cap = self._start + self.limit
        hard = self._fsize[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL(None).fflush(None)
        resource.setrlimit(resource.RLIMIT_FSIZE, self._fsize)
        signal.signal(signal.SIGXFSZ, self._xfsz)
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in self._saved:
            os.close(fd)
        faulthandler.enable(file=sys.__stderr__ or sys.stderr, all_threads=False)
        self._fault.close()
        try:
            size = os.stat(self.path).st_size
        except OSError:
            size = self._start
        self.bytes = size - self._start
        self.limited = self.bytes >= self.limit

    def text(self) -> str:
        """What the block wrote: whole up to 8 KiB, else its head and tail around a count."""
        return read_output(self.path, self._start)


def read_output(path: str, start: int = 0) -> str:
    """The output written to ``path`` from ``start``: head and tail when long."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            head = f.read(2 * _KEEP + 1)
            if len(head) <= 2 * _KEEP:
                return head.decode(errors="replace")
            size = os.fstat(f.fileno()).st_size - start
            f.seek(max(start, start + size - _KEEP))
            tail = f.read(_KEEP)
    except OSError:
        return ""
    skipped = size - 2 * _KEEP
    return (
        head[:_KEEP].decode(errors="replace")
        + f"\n[... {skipped} bytes of output left out ...]\n"
        + tail.decode(errors="replace")
    )


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


@contextlib.contextmanager
def memory_limit(allowance_mb: int) -> Iterator[None]:
    """Host memory the block may add: ``allowance_mb`` MiB over the data the process has now."""
    if allowance_mb <= 0:
        yield
        return
    saved = resource.getrlimit(resource.RLIMIT_DATA)
    cap = _status_kib("VmData") * 1024 + (allowance_mb << 20)
    if saved[1] != resource.RLIM_INFINITY:
        cap = min(cap, saved[1])
    resource.setrlimit(resource.RLIMIT_DATA, (cap, saved[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, saved)


class ReferenceTrap:
    """Record calls into functions defined in ``filenames`` while the block runs (every thread)."""

    def __init__(self, filenames: set[str]) -> None:
        self.filenames = {f for f in filenames if f}
        self.calls: list[str] = []

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename in self.filenames and len(self.calls) < 5:
            self.calls.append(f"{frame.f_code.co_name} (line {frame.f_code.co_firstlineno})")

    def __enter__(self) -> ReferenceTrap:
        self._saved = sys.getprofile()
        sys.setprofile(self._profile)
        threading.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(self._saved)
        threading.setprofile(None)  # type: ignore[arg-type,unused-ignore]


class ThreadWatch:
    """Threads started within the block and still running when it ends."""

    def __init__(self) -> None:
        self.left: list[str] = []

    def __enter__(self) -> ThreadWatch:
        self._before = {t.ident for t in threading.enumerate()}
        return self

    def __exit__(self, *exc: object) -> None:
        self.left = [t.name for t in threading.enumerate() if t.ident not in self._before and t.is_alive()]
