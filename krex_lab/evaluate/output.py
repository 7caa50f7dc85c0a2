"""The candidate's output, as a result shows it: head and tail of the file its process wrote
(stdout and stderr go there, never to the job's stdout; see :mod:`.candidate.process`)."""

from __future__ import annotations

import os
import stat

__all__ = ["read_output"]

_KEEP = 4096  # bytes of head and of tail kept of a candidate's output


def read_output(path: str, start: int = 0) -> str:
    """The output written to ``path`` from ``start``: head and tail when long. A regular file
    alone: a link (to a file the candidate could not read) or a pipe (that no one writes) is
    read as nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return ""
        with open(fd, "rb") as f:
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
