"""A pool that follows the node: ``krex run --gpu N`` on a pool that does not serve GPU ``N``.

A pool started while no arbiter answered serves the GPUs it found alone (one, without a GPU
library). An arbiter that starts later at the endpoint the pool watches is found within the
pool's resync, and the pool then serves its GPUs; one that starts elsewhere (the node's, a lab's:
wherever this command's discovery now leads) is never found by that pool. So, before refusing:

1. an arbiter answers where this command looks and the pool does not follow it yet: wait for the
   pool's resync to find it (a few seconds);
2. still not served, and the pool is one started on demand with nothing running, queued or
   leased: it is replaced by one started here, which follows the arbiter this command finds;
3. otherwise the GPU is not on this node, or the pool is busy or a lab's: the refusal says which.

Nothing here runs on the warm path: only a ``--gpu`` the pool's ``ping`` did not list gets here.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from ... import paths
from ...errors import InvalidRequest, KrexError
from .pool_client import PoolClient

#: the pool's resync (2 s by default) and a margin: how long an arbiter it watches takes to be found
CATCH_UP_S = 3.5
#: how long a replaced pool has to exit (it kills its idle workers)
EXIT_S = 15.0


def _node_arbiter() -> tuple[str, list[int]] | None:
    """The arbiter this command would use, and its GPUs, if one answers."""
    from ... import connection, discovery

    endpoint = discovery.default_endpoint()
    try:
        info = connection.hello(endpoint, 1.0)
    except (KrexError, OSError, TimeoutError):
        return None
    return endpoint, list(range(int(info.get("gpus", 0))))


def _served(client: PoolClient) -> list[int]:
    from ..wire import Ping

    client.info = client._request(Ping(), timeout=2.0)
    return list(client.info.gpus)


def serve_gpu(client: PoolClient, gpu: int) -> PoolClient:
    """A client of a pool that serves ``gpu``: ``client`` itself, or one of a pool started here
    in place of ``client``'s (closed then). Raises :class:`InvalidRequest` saying why none can."""
    assert client.info is not None
    node = _node_arbiter()
    if node is None or gpu not in node[1]:
        where = f"the arbiter at {node[0]} has GPUs {node[1]}" if node else f"the pool serves GPUs {client.info.gpus}"
        raise InvalidRequest(f"GPU {gpu} is not on this node ({where})")
    endpoint, gpus = node
    deadline = time.monotonic() + CATCH_UP_S
    while time.monotonic() < deadline:
        if gpu in _served(client):  # the pool found the arbiter (its resync) and serves its GPUs
            return client
        time.sleep(0.2)
    table = client.status()
    busy = len(table.running) + len(table.queue) + len(table.leases)
    if not table.pool.on_demand or busy:
        why = f"{busy} job(s) or lease(s) in it" if busy else "it was started for a lab or by `krex pool`"
        raise InvalidRequest(
            f"GPU {gpu} is not served by the pool at {client.endpoint} (GPUs {client.info.gpus}, arbiter "
            f"{table.pool.arbiter or 'none'}), and it is not replaced while {why}; the arbiter at {endpoint} "
            f"has GPUs {gpus}"
        )
    return _replace(client, gpu, endpoint, gpus)


def _replace(client: PoolClient, gpu: int, endpoint: str, gpus: list[int]) -> PoolClient:
    """End ``client``'s pool (an idle one started on demand, this user's: the kernel said who
    listens) and start one that follows the arbiter at ``endpoint``."""
    assert client.info is not None
    old = client.info
    listener = client.peer.pid if client.peer is not None else None
    if old.uid != os.getuid() or listener != old.pid:
        raise InvalidRequest(f"GPU {gpu} is not served by the pool at {client.endpoint} (GPUs {old.gpus})")
    if not paths.quiet():
        print(
            f"krex run: the pool (pid {old.pid}) serves GPUs {old.gpus}, not the GPUs {gpus} of the arbiter at "
            f"{endpoint}: it is replaced by one that does",
            file=sys.stderr,
            flush=True,
        )
    client.close()
    os.kill(old.pid, signal.SIGTERM)
    deadline = time.monotonic() + EXIT_S
    while os.path.exists(f"/proc/{old.pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    fresh = PoolClient.connect(client.endpoint, start=True)
    if fresh.info is None or gpu not in fresh.info.gpus:
        served = fresh.info.gpus if fresh.info is not None else []
        fresh.close()
        raise InvalidRequest(f"GPU {gpu} is not served by the pool started for it (GPUs {served})")
    return fresh
