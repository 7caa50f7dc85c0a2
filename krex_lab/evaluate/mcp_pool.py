"""The pool an MCP server evaluates on: this user's, connected once; one the server had to start
is ended with the server (unless someone else's jobs run in it)."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..workers.client import PoolClient

#: the server's client of the pool, under "client" once made (its import waits for the first call)
_POOL: dict[str, PoolClient] = {}
_POOL_LOCK = threading.Lock()


def server_pool() -> PoolClient:
    """The server's client of this user's pool, made once; a pool it had to start is ended with
    the server (:func:`end_started_pool`)."""
    from ..workers.client import PoolClient

    with _POOL_LOCK:
        if "client" not in _POOL:
            _POOL["client"] = PoolClient.connect(start=True)
        return _POOL["client"]


def end_started_pool(wait: float = 15.0) -> str | None:
    """End the pool this server started, if it runs nothing of anyone's now; what happened, in
    words (None: the server started none)."""
    import os
    import signal

    client = _POOL.pop("client", None)
    pid = client.started_pid if client is not None else None
    if client is None or pid is None:
        if client is not None:
            client.close()
        return None
    try:
        table = client.status()
        busy = len(table.running) + len(table.queue) + len(table.leases)
        idle_exit = table.pool.idle_exit_s
    except Exception:  # gone already, or not answering: nothing of ours to end
        client.close()
        return None
    client.close()
    if busy:
        return f"the pool it started (pid {pid}) is busy with {busy} other job(s): it exits after {idle_exit:g} idle s"
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return None
    deadline = time.monotonic() + wait
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    return f"the pool it started (pid {pid}) was stopped"
