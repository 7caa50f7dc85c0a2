"""What the kernel says about the other end of a UNIX socket (``SO_PEERCRED``).

Used both ways: a server learns who connected (the arbiter's identity socket), a client learns
who listens before it sends anything (the arbiter's and the pool's sockets). For a listening
socket the kernel reports the process that called ``listen``.
"""

from __future__ import annotations

import socket
import struct
import time

_UCRED = struct.Struct("3i")


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a connected UNIX socket."""
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid, gid


def listener_credentials(path: str, timeout: float = 2.0) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process listening on the UNIX stream socket ``path``. Connects and
    sends nothing; raises ``OSError`` (``FileNotFoundError``, ``ConnectionRefusedError``) when
    nobody listens there. A listener whose backlog is full (``EAGAIN``: a flood of other
    connections, which the server refuses) is tried again until ``timeout``."""
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(timeout)
            try:
                sock.connect(path)
            except BlockingIOError:
                if time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)  # the listener is behind on its backlog: its next accept frees a place
                pause = min(pause * 2, 0.05)
                continue
            return peer_credentials(sock)
