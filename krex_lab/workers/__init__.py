"""Persistent context workers: candidate code runs warm, crashes cost a worker, never a result.

Processes (one user, one node)::

    clients (krex run, notebook kernels, krex_lab.submit)
        │  DEALER ──JSON──▶ ROUTER  KREX_POOL_ENDPOINT (ipc, the user's 0700 runtime dir, socket 0600)
        ▼
    pool service  (krex_lab.workers.pool: asyncio; gate watcher SUB ◀── arbiter PUB krex.gate)
        │  per worker: a socketpair (jobs, results), two pipes (the worker's fd 1 and 2), a pidfd
        ▼
    context workers (krex_lab.workers.worker: one per process, pinned to one GPU, sessions of the arbiter)

Modules: :mod:`.jobs` (wire types, JobResult), :mod:`.client` (PoolClient, submit),
:mod:`.pool` (the service and its traitlets options), :mod:`.dispatch` (queue, leases, sizing),
:mod:`.nanny` (one worker process, watched), :mod:`.gates` (the arbiter link),
:mod:`.worker` and :mod:`.runner` / :mod:`.reset` (inside a worker), :mod:`.run_cli` (``krex run``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .client import PoolClient, submit
    from .jobs import JobResult, PoolUnavailable, RemoteError

__all__ = ["JobResult", "PoolClient", "PoolUnavailable", "RemoteError", "submit"]


def __getattr__(name: str) -> Any:
    if name in ("PoolClient", "submit"):
        from . import client

        return getattr(client, name)
    if name in ("JobResult", "PoolUnavailable", "RemoteError"):
        from . import jobs

        return getattr(jobs, name)
    raise AttributeError(f"module 'krex_lab.workers' has no attribute {name!r}")
