"""A script job's stdin, as ``krex run`` forwards it: this process's, read whole."""

from __future__ import annotations

import os
import select
import stat

#: the most stdin a script job carries (:func:`read_stdin`): it travels whole, in the submit
STDIN_LIMIT = 64 << 20
#: how long a pipe on stdin may stay empty before ``krex run`` goes on without it
PIPE_WAIT = 0.05

#: what ``krex run`` says on stderr when it went on without its stdin pipe
UNREAD_PIPE = (
    f"stdin is a pipe that had nothing to read within {PIPE_WAIT * 1000:.0f} ms: the script runs without it "
    "(krex run sends stdin whole as it starts; write it to a file and redirect, `< FILE`)"
)


def stdin_is_pipe() -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(0).st_mode)
    except OSError:
        return False


def read_stdin(limit: int = STDIN_LIMIT) -> bytes | None:
    """This process's stdin for a script job, as ``krex run`` forwards it: the whole content of a
    pipe or a regular file, read to its end (None for a terminal, ``/dev/null`` or a socket, which
    the script then does not get, and for a pipe still empty after :data:`PIPE_WAIT`: then
    :data:`UNREAD_PIPE` says so). Over ``limit`` bytes: :class:`InvalidRequest`."""
    try:
        mode = os.fstat(0).st_mode
    except OSError:
        return None
    if not (stat.S_ISFIFO(mode) or stat.S_ISREG(mode)):
        return None
    # A pipe that some parent holds open without writing (agents' and IDEs' shells do) must not
    # hang `krex run`: forward a pipe only when it has data or is closed within a moment.
    if stat.S_ISFIFO(mode) and not select.select([0], [], [], PIPE_WAIT)[0]:
        return None
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = os.read(0, min(1 << 20, limit + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            from ...errors import InvalidRequest  # here only: `krex run`'s start pays for no import it need not

            raise InvalidRequest(
                f"stdin is larger than {limit >> 20} MiB: `krex run` sends a script's stdin whole; "
                "pass a file name instead"
            )
