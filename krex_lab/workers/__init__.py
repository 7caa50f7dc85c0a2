"""Persistent context workers: candidate code runs warm, crashes cost a worker, never a result.

Processes (one user, one node)::

    clients (krex run, notebook kernels, krex_lab.submit)          krex_lab.workers.client
        │  DEALER ──msgpack──▶ ROUTER  KREX_POOL_ENDPOINT (ipc, the user's 0700 runtime dir, socket 0600)
        ▼
    pool service  (asyncio; gate watcher SUB ◀── arbiter PUB krex.gate)  krex_lab.workers.pool
        │  per worker: a socketpair (msgpack frames), two pipes (the worker's fd 1 and 2), a pidfd
        ▼
    context workers (one per process, pinned to one GPU, sessions of the arbiter)  krex_lab.workers.context

Shared by all three: :mod:`.wire` (every message, typed), :mod:`.results` (JobResult, exit
statuses), :mod:`.endpoint` (where the pool listens, its lock file).
"""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` costs `krex run`'s start; the checker alone reads these names
if TYPE_CHECKING:
    from typing import Any

    from ..errors import PoolUnavailable, RemoteError
    from .client import PoolClient, submit
    from .results import JobResult

__all__ = ["JobResult", "PoolClient", "PoolUnavailable", "RemoteError", "submit"]


def __getattr__(name: str) -> Any:
    # Lazy: `import krex_lab` must not pay for zmq and msgspec.
    if name in ("PoolClient", "submit"):
        from . import client

        return getattr(client, name)
    if name == "JobResult":
        from . import results

        return results.JobResult
    if name in ("PoolUnavailable", "RemoteError"):
        from .. import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'krex_lab.workers' has no attribute {name!r}")
