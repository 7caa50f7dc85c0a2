"""The node as the pool knows it: the arbiter that answers there (through its gates), the GPU
backend and the GPUs' UUIDs, and what a job that ran without an arbiter session is told.

A pool may serve before any arbiter answers (``krex run`` starts one on demand, maybe before
``krex lab`` starts the node's arbiter): it then looks at the node itself and assumes what it
finds, and takes the arbiter's view once one answers (:meth:`NodeView.learn`). What the pool
does about a change (resize, replace workers whose session is gone) is :mod:`.service`'s; this
module only knows.
"""

from __future__ import annotations

import logging
import os

from ..._version import __version__
from ..endpoint import ipc_path, listens
from .gates import GateWatcher
from .handle import WorkerHandle
from .jobs import Job
from .spawn import NodeBackend

__all__ = ["NodeView"]

log = logging.getLogger("krex.pool")


class NodeView:
    """What the pool knows of its node; ``gates`` is its link to the arbiter at ``arbiter_endpoint``."""

    def __init__(self, arbiter_endpoint: str, gates: GateWatcher) -> None:
        self.arbiter_endpoint = arbiter_endpoint
        self.gates = gates
        self.backend = NodeBackend()
        self.gpu_uuids: dict[int, str] = {}
        #: an arbiter has answered once (its backend and GPUs are the ones known)
        self.known = False
        self._gone_since: float | None = None

    @property
    def answering(self) -> bool:
        """An arbiter answers now, and the pool has learnt its view."""
        return self.gates.connected and self.known

    def learn(self) -> None:
        """Take the backend and the GPUs' UUIDs of the arbiter that answers now."""
        assert self.gates.info is not None
        self.known = True
        self.backend = NodeBackend(self.gates.info.backend, self.gates.info.simulated)
        self.gpu_uuids = dict(self.gates.uuids)

    async def discover(self, wait: float, fallback_gpus: int) -> int:
        """How many GPUs the node has: the arbiter's count if one answers within ``wait`` s, else
        what the pool finds itself (``fallback_gpus`` simulated ones where it finds no backend)."""
        if await self.gates.start(wait):
            assert self.gates.info is not None
            self.learn()
            return self.gates.info.gpus
        log.warning(
            "no arbiter answers at %s: workers run unregistered, regions are unavailable and "
            "no gate is honoured until one answers",
            self.arbiter_endpoint,
        )
        return self.local_gpus(fallback_gpus)

    def local_gpus(self, fallback_gpus: int) -> int:
        try:
            from ...gpu import make_backend  # here only: a pool whose arbiter answers never loads it

            backend = make_backend("auto", fallback_gpus)
            try:
                self.backend = NodeBackend(backend.name, backend.simulated)
                self.gpu_uuids = {g.index: g.uuid for g in backend.inventory()}
                return backend.gpu_count()
            finally:
                backend.close()
        except Exception as exc:
            log.warning("no GPU backend either (%s): assuming %d simulated GPU(s)", exc, fallback_gpus)
            return fallback_gpus

    def stale(self, w: WorkerHandle) -> bool:
        """The worker has no session with the arbiter that answers now."""
        return self.gates.connected and w.init.arbiter_pid != self.gates.arbiter_pid

    def gone(self, exit_after: float, last_busy: float, now: float) -> bool:
        """The arbiter answered once and has not for ``exit_after`` s (0: never said), counted from
        ``last_busy`` at the earliest."""
        if not (exit_after > 0 and self.known):
            return False
        if self.listens():
            self._gone_since = None
            return False
        if self._gone_since is None:
            self._gone_since = now
        return now - max(self._gone_since, last_busy) >= exit_after

    def listens(self) -> bool:
        """Someone listens on the arbiter's ipc socket (a plain connect, nothing sent); for other
        endpoints, the last re-read of the gates succeeded."""
        path = ipc_path(self.arbiter_endpoint)
        return not self.gates.failing if path is None else listens(path)

    def unregistered(self, job: Job) -> str | None:
        """The notice of a job that ran on a worker with no arbiter session (``krex run`` prints it),
        where that changed something: the arbiter this pool knew has gone, or would not register
        the worker, so that others' regions on its GPU did not pause it. With no arbiter on the node
        at all there are no regions to miss (the pool's log says so once, at start; ``--exclusive``
        fails with its own error)."""
        w = job.worker
        if w is None or w.session is not None or w.info is None:
            return None
        if w.init.arbiter is None:
            if not self.known:
                return None
            return (
                f"the arbiter at {self.arbiter_endpoint} stopped answering: the job ran unregistered, "
                "not paused by others' regions on its GPU"
            )
        return (
            f"the worker could not register with the arbiter at {self.arbiter_endpoint} "
            f"({w.info.session_error}): the job ran without GPU exclusivity"
        )

    def serving_line(self, bound: str, gpus: list[int]) -> str:
        """``krex pool <version> serving on <endpoint> (GPUs [...], arbiter <endpoint>; ...)``."""
        arbiter = self.arbiter_endpoint if self.gates.connected else "none answers yet"
        sim = " [SIMULATED GPUs: fake backend]" if self.backend.simulated else ""
        return (
            f"krex pool {__version__} serving on {bound} (GPUs {gpus}, arbiter {arbiter}; "
            f"pid {os.getpid()}, backend {self.backend.name}{sim})"
        )
