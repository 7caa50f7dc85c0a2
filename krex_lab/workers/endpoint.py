"""Where this user's pool listens, and the lock file that says one serves there.

Shared by the pool (binds and locks; probes its arbiter's socket) and its clients (connect; test
the lock to skip a ping that could only time out).
"""

from __future__ import annotations

import os
import socket

from .. import paths


def default_endpoint() -> str:
    """``KREX_POOL_ENDPOINT`` when set, else ``ipc://<runtime dir>/pool.sock`` in this user's own
    runtime dir (0700), even when ``KREX_RUNTIME_DIR`` names a system arbiter's (root's)."""
    return os.environ.get(paths.POOL_ENDPOINT_ENV) or f"ipc://{paths.own_runtime_dir() / 'pool.sock'}"


def ipc_path(endpoint: str) -> str | None:
    """The socket file of an ``ipc://`` endpoint, else None."""
    return endpoint[len("ipc://") :] if endpoint.startswith("ipc://") else None


def lock_path(endpoint: str) -> str | None:
    """The lock file a pool holds while it serves an ipc endpoint (None for tcp: no file to lock)."""
    path = ipc_path(endpoint)
    return None if path is None else path + ".lock"


def listens(path: str) -> bool:
    """Someone listens on the UNIX socket file ``path`` (a plain connect, nothing sent)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        try:
            probe.connect(path)
        except BlockingIOError:
            return True  # listening, its backlog full
        except OSError:
            return False
    return True
