"""The pool service: one per user per node, owning that user's context workers.

``krex pool`` (or ``python -m krex_lab.workers.pool``) runs it in the foreground; the Jupyter
server extension runs it as a subprocess and stops it with SIGTERM; ``krex run`` starts one on
demand (``--on-demand``: it then exits after ``on_demand_idle_exit`` seconds without work).

It binds a ZeroMQ ROUTER at ``KREX_POOL_ENDPOINT`` (default ``ipc://<runtime dir>/pool.sock``).
**Never shared between users**: the runtime directory is the user's own (0700, refused if
someone else owns it) and the socket file is made 0600 under a 0077 umask, so only this user (and
root) can connect; tcp endpoints, which any local user could reach, are refused unless
``allow_tcp``. Workers are this process's children, run as this user and are never handed to
another pool; so a worker that ran one user's code never runs another's. A lock file next to
the socket keeps a second pool off the same endpoint. On SIGTERM/SIGINT/SIGHUP every job in flight
gets a "pool shutting down" result and every worker (with everything it started) is killed.
The pool is a child subreaper (:mod:`krex_lab.workers.contain`): what a job started never
outlives it, daemons included, and nothing survives the pool's shutdown.

The server's lifecycle (lock, bind, receive, one reply per request, stop) is
:class:`krex_lab.rpc_server.Service`'s; this module holds the pool's handlers, its traitlets options
and what it does when the node changes; :mod:`.node` is what it knows of the node (arbiter,
backend, GPUs), :mod:`.app` the process around it. Messages: :mod:`krex_lab.workers.wire`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import msgspec
from traitlets import Bool, Dict, Float, Int, List, Unicode, default
from traitlets.config import LoggingConfigurable

from ... import discovery
from ..._version import __version__
from ...errors import KrexError
from ...rpc_server import DEFERRED, Peer, Service, lock_holder
from ..contain import become_subreaper, ident, live
from ..endpoint import default_endpoint, ipc_path, lock_path
from ..results import JobResult
from ..wire import (
    MAX_MESSAGE,
    Accepted,
    Init,
    Interrupt,
    Output,
    Ping,
    PoolInfo,
    PoolRow,
    PoolStatus,
    PoolTable,
    Released,
    ReleaseLease,
    Size,
    Sized,
    Submit,
    decode_request,
)
from . import handle
from .clients import ClientWatch
from .dispatcher import DispatchConfig, Dispatcher
from .fast_server import FastServer
from .gates import GateWatcher
from .jobs import Job, job_of
from .node import NodeView
from .spawn import PLACEMENT, WORKER_MODULE, worker_launch

__all__ = ["PLACEMENT", "WORKER_MODULE", "Pool", "serving_log"]

log = logging.getLogger("krex.pool")
#: the start-up line's and the exit reason's own logger: ``krex pool`` shows them at its default
#: level (WARNING), at which the rest of ``krex.pool`` stays quiet (:meth:`PoolApp.initialize`)
serving_log = logging.getLogger("krex.pool.serving")


def default_start_concurrency() -> int:
    """Workers started at once unless configured: one per CPU this process may run on, at least 2."""
    return max(2, len(os.sched_getaffinity(0)))


class Pool(LoggingConfigurable):
    endpoint = Unicode(
        "", help="ROUTER endpoint to serve (default: $KREX_POOL_ENDPOINT, else ipc://<runtime dir>/pool.sock)."
    ).tag(config=True)
    arbiter = Unicode("", help="Arbiter endpoint (default: $KREX_ENDPOINT, else the runtime dir's).").tag(config=True)
    workers_per_gpu = Int(1, help="Active workers per GPU (they take jobs).").tag(config=True)
    spares_per_gpu = Int(
        1, help="Warm spare workers per GPU, promoted at once when an active one dies or is recycled."
    ).tag(config=True)
    max_workers_per_gpu = Int(
        8,
        help="Most active workers per GPU: leases may add active workers up to this many, so that plain jobs keep one.",
    ).tag(config=True)
    gpus = List(Int(), help="Serve only these GPUs (arbiter indices); empty: all of them.").tag(config=True)
    fallback_gpus = Int(1, help="GPUs to assume when no arbiter answers at start.").tag(config=True)
    preload = List(
        Unicode(),
        default_value=["numba.cuda", "cupy", "torch"],
        help="Modules each worker imports before it takes jobs (on a real GPU also creating "
        "their CUDA context); each is optional and skipped if it does not import.",
    ).tag(config=True)
    ready_hooks = List(
        Unicode(),
        default_value=["krex_lab.evaluate.judge.spares:prestart"],
        help="Functions (module:name) each worker calls with its device ('cuda' or 'cpu') once torch "
        "is preloaded, before it takes jobs: the evaluator's candidate zygote starts there, off any "
        "job's clock. A hook that fails is said in the worker's log and skipped.",
    ).tag(config=True)
    warmup = Bool(
        True,
        help="On a real GPU, run one tiny operation per framework at start (loads cuBLAS "
        "and friends), so that no job pays it.",
    ).tag(config=True)
    start_concurrency = Int(
        help="Workers starting at the same time (default: the node's CPUs, at least 2). Each start "
        "is mostly `import torch` (3-4 s of one core) and the CUDA context (serialized node-wide by "
        "the driver: 2.6 s for 16 at once): started two at a time, 16 workers took 54 s on an H100 "
        "node of 16 cores. A batch begins on the first worker ready, not the last.",
    ).tag(config=True)

    @default("start_concurrency")
    def _default_start_concurrency(self) -> int:
        return default_start_concurrency()

    job_timeout = Float(0.0, help="Default timeout of a job in seconds (0: none); a job may set its own.").tag(
        config=True
    )
    interrupt_grace = Float(
        5.0, help="Seconds a job has to stop after its interrupt (timeout, client gone) before its worker is killed."
    ).tag(config=True)
    lease_idle_timeout = Float(
        3600.0, help="A lease unused for this many seconds is released (its worker reset); 0: never."
    ).tag(config=True)
    idle_exit = Float(0.0, help="Exit after this many seconds without jobs or leases (0: never).").tag(config=True)
    on_demand = Bool(
        False, help="Started on demand by a client (krex run): exit after on_demand_idle_exit seconds without work."
    ).tag(config=True)
    on_demand_idle_exit = Float(
        help="idle_exit of a pool started on demand (default: $KREX_POOL_IDLE_EXIT, else 600 s)."
    ).tag(config=True)
    step_aside = Bool(
        False,
        help="If another pool already serves the endpoint, exit 0 quietly: for launchers that only need "
        "one to serve (the Jupyter extension; a pool started on demand always does). Without it a "
        "second pool says which one serves and exits 1.",
    ).tag(config=True)
    max_jobs_per_worker = Int(0, help="Recycle a worker after this many jobs (0: never).").tag(config=True)
    memory_slack_mb = Int(
        256,
        help="A reset leaves GPU memory at most this much above the worker's baseline, else the worker is recycled.",
    ).tag(config=True)
    python = Unicode("", help="Interpreter for workers (default: the pool's own).").tag(config=True)
    worker_env = Dict(help="Extra environment variables for workers.").tag(config=True)
    allow_tcp = Bool(
        False,
        help="Serve a tcp:// endpoint. Anyone who can reach it runs code as you: "
        "leave off unless the network is yours alone.",
    ).tag(config=True)
    arbiter_wait = Float(
        0.0,
        help="Seconds to wait at start for the arbiter to answer (it may be starting "
        "too); without one the pool serves unregistered workers until it appears.",
    ).tag(config=True)
    resync = Float(2.0, help="Seconds between re-reads of the arbiter's gates (events are the fast path).").tag(
        config=True
    )
    arbiter_gone_exit = Float(
        3.0,
        help="A pool started on demand whose arbiter has stopped answering exits after this many "
        "seconds without work (0: only on_demand_idle_exit applies).",
    ).tag(config=True)

    @default("on_demand_idle_exit")
    def _default_idle(self) -> float:
        return float(os.environ.get("KREX_POOL_IDLE_EXIT", "600"))

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bound = self.endpoint or default_endpoint()
        self.arbiter_endpoint = self.arbiter or discovery.default_endpoint()
        self.started = time.time()
        self._last_busy = time.monotonic()
        # Every component exists from here on; serve() only discovers the GPUs and starts them.
        self.gates = GateWatcher(self.arbiter_endpoint, self._gates_changed, self.resync)
        self.node = NodeView(self.arbiter_endpoint, self.gates)
        config = DispatchConfig(
            workers_per_gpu=self.workers_per_gpu,
            spares_per_gpu=self.spares_per_gpu,
            max_workers_per_gpu=self.max_workers_per_gpu,
            start_concurrency=self.start_concurrency,
            interrupt_grace=self.interrupt_grace,
            max_jobs_per_worker=self.max_jobs_per_worker,
            keep_env=PLACEMENT,
        )
        self.dispatcher = Dispatcher(config, self.gates, self._emit, self.spawn_args, self.node.stale)
        self.clients = ClientWatch(self.dispatcher.client_gone)
        lock = lock_path(self.bound)
        self.service = Service(
            "pool",
            self.bound,
            {
                Ping: self._ping,
                PoolStatus: self._status,
                ReleaseLease: self._release,
                Interrupt: self._interrupt,
                Submit: self._submit,
                Size: self._size,
            },
            decode_request,
            lock=Path(lock) if lock else None,
            max_message=MAX_MESSAGE,
            lossless=True,
            signals=(signal.SIGTERM, signal.SIGINT, signal.SIGHUP),
        )
        ipc = ipc_path(self.bound)
        #: the short way of `krex run` (a plain socket beside the ipc one; none for tcp)
        self.fast = FastServer(ipc, self._ping, self._submit, self._interrupt) if ipc else None

    # -- workers ------------------------------------------------------------------------------------
    def spawn_args(self, wid: int, gpu: int) -> tuple[list[str], dict[str, str], Init]:
        return worker_launch(
            wid,
            gpu,
            python=self.python,
            worker_env=self.worker_env,
            backend=self.node.backend,
            gpu_uuids=self.node.gpu_uuids,
            arbiter_endpoint=self.arbiter_endpoint,
            arbiter_connected=self.gates.connected,
            arbiter_pid=self.gates.arbiter_pid,
            preload=self.preload,
            ready_hooks=self.ready_hooks,
            warmup=self.warmup,
            memory_slack_mb=self.memory_slack_mb,
        )

    def _gates_changed(self) -> None:
        d = self.dispatcher
        if self.gates.connected and not self.node.known:
            self.node.learn()
            if d.gpus:  # serving already, on the GPUs assumed while no arbiter answered
                self._resize_to_arbiter()
        # Workers registered with no arbiter, or with one that has since restarted, have no
        # session there: idle ones are replaced now, busy ones when their job ends.
        for w in list(d.workers.values()):
            if w.state == "idle" and w.lease is None and self.node.stale(w):
                d.recycle(w, "its arbiter session is gone: a new worker registers")
        d.rebalance()
        d.dispatch()

    def _resize_to_arbiter(self) -> None:
        """Serve the GPUs of the arbiter that answers now, not those assumed without one (a pool
        that ``krex run`` started before ``krex lab`` started its arbiter with more GPUs)."""
        assert self.gates.info is not None
        d = self.dispatcher
        count = self.gates.info.gpus
        gpus = [g for g in range(count) if not self.gpus or g in self.gpus]
        if not gpus or gpus == d.gpus:
            return
        was = list(d.gpus)
        d.set_gpus(gpus)
        for w in list(d.workers.values()):
            if w.gpu not in gpus and w.state == "idle" and w.lease is None:
                d.recycle(w, f"GPU {w.gpu} is not the arbiter's")
        serving_log.info("%s (was GPUs %s, assumed before the arbiter answered)", self.serving_line(gpus), was)

    async def _discover(self) -> list[int]:
        count = await self.node.discover(self.arbiter_wait, self.fallback_gpus)
        gpus = [g for g in range(count) if not self.gpus or g in self.gpus]
        if not gpus:
            raise KrexError(f"no GPU to serve: the node has {count}, the pool was asked for {list(self.gpus)}")
        return gpus

    # -- lifecycle ----------------------------------------------------------------------------------
    async def serve(self, ready: asyncio.Event | None = None) -> int:
        if lock_path(self.bound) is None and not self.allow_tcp:
            self.service.close()
            raise KrexError(
                f"refusing to serve {self.bound}: any local user could run code as you there. "
                "Use an ipc:// endpoint, or set Pool.allow_tcp if the network is yours alone."
            )
        lock = lock_path(self.bound)
        if lock is not None:
            Path(lock).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self.service.take_lock(note=str(os.getpid())):
            self.service.close()
            if self.on_demand or self.step_aside:  # e.g. two clients started one each at once
                log.info("another pool already serves %s", self.bound)
                return 0
            holder = lock_holder(Path(self.service.lock_path)) if self.service.lock_path else None
            log.error(
                "another pool%s already serves %s: nothing to start (stop it first, or give --endpoint)",
                f" (pid {holder.strip()})" if holder and holder.strip() else "",
                self.bound,
            )
            return 1
        # Orphans of a worker that dies (daemons of its jobs) are re-parented here and swept;
        # children this process already had are its host's, never swept.
        from ...procutil import children

        handle.spared_children[:] = [ident(p) for p in children(os.getpid()) if live(p)]
        if not become_subreaper():
            log.warning(
                "PR_SET_CHILD_SUBREAPER refused: a daemon started by a job may outlive a worker "
                "that dies before its job ends"
            )
        try:
            gpus = await self._discover()
            self.service.bind()
            if self.fast is not None:
                await self.fast.start()
        except BaseException:
            self.gates.close()
            self.service.close()
            raise
        self.dispatcher.set_gpus(gpus)
        serving_log.info("%s", self.serving_line(gpus))
        self.dispatcher.rebalance()
        try:
            await self.service.run([self._housekeeping()], ready)
        finally:
            if self.service.stopped_by is not None:  # the other reasons say so where they stop it
                serving_log.info("%s received: stopping", self.service.stopped_by.name)
            await self.shutdown()
        return 0

    def serving_line(self, gpus: list[int]) -> str:
        return self.node.serving_line(self.bound, gpus)

    def stop(self) -> None:
        self.service.stop()

    async def shutdown(self) -> None:
        d = self.dispatcher
        d.closing = True
        if self.fast is not None:
            self.fast.close()  # no new job; those in flight still get their results below
        for job in list(d.jobs.values()):
            d.finish(
                job,
                JobResult(
                    ok=False,
                    status="cancelled",
                    error="the pool is shutting down",
                    exit_code=143 if job.kind == "script" else None,
                ),
            )
        workers = list(d.workers.values())
        for w in workers:
            w.kill("pool shutting down")
        await asyncio.gather(*(w.wait_dead(5.0) for w in workers))
        left = handle.sweep_orphans_until_clean()
        if left:
            log.error("processes started by jobs survived SIGKILL: %s", left)
        self.gates.close()
        self.clients.close()
        self.service.close(linger_ms=1000)  # let the "shutting down" results reach their clients
        serving_log.info("krex pool stopped")

    async def _housekeeping(self) -> None:
        d = self.dispatcher
        while True:
            await asyncio.sleep(0.5)
            handle.sweep_orphans()
            d.expire_leases(self.lease_idle_timeout)
            limit = self.on_demand_idle_exit if self.on_demand else self.idle_exit
            if d.busy():
                self._last_busy = time.monotonic()
            elif limit > 0 and time.monotonic() - self._last_busy > limit:
                serving_log.info("idle for %.0f s: exiting", limit)
                self.stop()
            elif self._arbiter_gone():
                serving_log.info(
                    "the arbiter at %s has stopped answering and this pool (started on demand) is idle: exiting",
                    self.arbiter_endpoint,
                )
                self.stop()

    def _arbiter_gone(self) -> bool:
        """An on-demand pool whose arbiter answered once and has not for ``arbiter_gone_exit`` s."""
        return self.on_demand and self.node.gone(self.arbiter_gone_exit, self._last_busy, time.monotonic())

    # -- clients ------------------------------------------------------------------------------------
    def _emit(self, job: Job, message: Output | JobResult) -> None:
        peer: Peer = job.client
        if isinstance(message, JobResult):
            unchecked = self.node.unregistered(job)
            if unchecked:
                message.notice = f"{message.notice}; {unchecked}" if message.notice else unchecked
            peer.reply(message)  # the submit's one reply: the job's one result
        else:
            peer.send(message)

    def _ping(self, request: Ping, peer: Peer) -> PoolInfo:
        return PoolInfo(
            pid=os.getpid(),
            uid=os.getuid(),
            version=__version__,
            endpoint=self.bound,
            gpus=list(self.dispatcher.gpus),
            backend=self.node.backend.name,
            simulated=self.node.backend.simulated,
            no_arbiter=None if self.node.answering else f"no KREX arbiter answers at {self.arbiter_endpoint}",
        )

    def _status(self, request: PoolStatus, peer: Peer) -> PoolTable:
        return self.status()

    def _release(self, request: ReleaseLease, peer: Peer) -> Released:
        return Released(self.dispatcher.release_lease(request.lease))

    def _interrupt(self, request: Interrupt, peer: Peer) -> None:
        d = self.dispatcher
        job = d.jobs.get(request.job or "") or (d.by_rid.get(request.target) if request.target is not None else None)
        if job is not None:
            d.interrupt(job, request.force)

    def _size(self, request: Size, peer: Peer) -> Sized:
        if request.per_gpu < 0:
            raise ValueError(f"per_gpu must be >= 0, not {request.per_gpu}")
        if request.per_gpu:
            self.clients.watch(request.pid)  # its ask (or cap) ends with it
        return Sized(self.dispatcher.size(request.pid, request.per_gpu, request.cap))

    def _submit(self, request: Submit, peer: Peer) -> Any:
        d = self.dispatcher
        job = job_of(request, peer, d.new_id, d.gpus, self.gates.closed, self.job_timeout)
        if request.pid is not None:
            self.clients.watch(request.pid)
        peer.send(Accepted(id=request.id, job=job.id, queued=len(d.queue)))
        d.submit(job)
        return DEFERRED  # the reply is the job's result (Dispatcher.finish -> _emit)

    def status(self) -> PoolTable:
        pool = PoolRow(
            pid=os.getpid(),
            uid=os.getuid(),
            endpoint=self.bound,
            started=self.started,
            on_demand=self.on_demand,
            idle_exit_s=self.on_demand_idle_exit if self.on_demand else self.idle_exit,
            # said once learnt, GPUs and all: a lab that finds it then knows what it will serve
            arbiter=self.arbiter_endpoint if self.node.answering else None,
            preload=list(self.preload),
            workers_per_gpu=self.workers_per_gpu,
            spares_per_gpu=self.spares_per_gpu,
            backend=self.node.backend.name,
            simulated=self.node.backend.simulated,
        )
        return PoolTable(pool=pool, **msgspec.structs.asdict(self.dispatcher.status()))
