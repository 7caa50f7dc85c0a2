"""The pool's bookkeeping: the job queue, sticky leases, and what the workers say (how many
workers each GPU keeps is :mod:`.sizing`'s, the base of :class:`Dispatcher`).

Every job gets exactly one result: :meth:`Dispatcher.finish` is the only place that sends one,
and it refuses a second.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from collections.abc import Callable

from ..results import INTERRUPT_EXIT, JobResult, describe_exit
from ..wire import DispatcherTable, Done, FromWorker, Output, Ready, Reset
from .handle import WorkerHandle
from .jobs import DispatchConfig, Emit, Gates, Job, Lease, SpawnArgs, cancelled, completed, worker_lost
from .sizing import Sizing
from .status import dispatcher_status

__all__ = ["DispatchConfig", "Dispatcher", "Emit", "Gates", "Job", "Lease", "SpawnArgs"]

log = logging.getLogger("krex.pool")


class Dispatcher(Sizing):
    """Queue, leases and sizing of one pool; it gets what it uses, never the pool itself.

    ``emit`` sends a job's messages to its client, ``spawn_args`` says how to start a worker,
    ``stale`` whether a worker's arbiter session is gone (it is then replaced when idle).
    """

    def __init__(
        self,
        config: DispatchConfig,
        gates: Gates,
        emit: Emit,
        spawn_args: SpawnArgs,
        stale: Callable[[WorkerHandle], bool] = lambda w: False,
        gpus: list[int] | None = None,
    ) -> None:
        super().__init__(config)
        self.gates = gates
        self.emit = emit
        self.spawn_args = spawn_args
        self.stale = stale
        self.queue: list[Job] = []
        self.jobs: dict[str, Job] = {}
        self.by_rid: dict[int, Job] = {}
        self.leases: dict[str, Lease] = {}
        self._ids = 0
        self._wids = 0
        #: GPUs where one of our jobs runs with exclusive=True: closed to our other jobs at once,
        #: before the arbiter's gate event could arrive
        self.exclusive_gpus: dict[int, str] = {}
        self.set_gpus(gpus or [])

    # -- jobs -------------------------------------------------------------------------------------
    def new_id(self) -> str:
        self._ids += 1
        return f"j{self._ids}"

    def submit(self, job: Job) -> None:
        self.jobs[job.id] = job
        self.by_rid[job.rid] = job
        if job.lease is not None:
            lease = self.leases.get(job.lease)
            if lease is None:
                lease = self.leases[job.lease] = Lease(job.lease, job.client_pid)
            lease.pending += 1
        self.queue.append(job)
        self.counters["submitted"] += 1
        if job.within is not None and job.gpu is not None:
            self._new_worker(job.gpu, False, for_job=job)
        self.dispatch()

    def dispatch(self) -> None:
        if self.closing:
            return
        for job in list(self.queue):
            worker = self._pick(job)
            if worker is not None:
                self.queue.remove(job)
                self._start(job, worker)

    def gpu_open(self, gpu: int) -> bool:
        """No region on ``gpu`` (the arbiter's gate), and no exclusive job of ours running or waiting there."""
        return self.gates.is_open(gpu) and gpu not in self.exclusive_gpus

    def _eligible(self, w: WorkerHandle, gpu: int | None) -> bool:
        return (
            w.for_job is None
            and w.state == "idle"
            and w.active
            and w.lease is None
            and w.expected is None
            and self.gpu_open(w.gpu)
            and (gpu is None or w.gpu == gpu)
        )

    def _pick(self, job: Job) -> WorkerHandle | None:
        if job.within is not None:
            # Its own worker, part of the region: the region's closed gate is no bar to it.
            mine = [w for w in self.workers.values() if w.for_job is job]
            return next((w for w in mine if w.state == "idle" and w.expected is None), None)
        gpu = job.gpu
        if job.lease is not None:
            lease = self.leases[job.lease]
            if lease.worker is not None:
                w = lease.worker
                return w if w.state == "idle" and w.expected is None and self.gpu_open(w.gpu) else None
            if gpu is None:
                gpu = lease.gpu
        candidates = [w for w in self.workers.values() if self._eligible(w, gpu)]
        if not candidates:
            return None
        busy = collections.Counter(w.gpu for w in self.workers.values() if w.state == "busy")
        return min(candidates, key=lambda w: (busy[w.gpu], w.gpu, w.id))

    def _start(self, job: Job, w: WorkerHandle) -> None:
        loop = asyncio.get_running_loop()
        w.state, w.job, w.job_stderr = "busy", job, ""
        if job.lease is not None:
            lease = self.leases[job.lease]
            if lease.worker is None:
                lease.worker, lease.gpu, w.lease = w, w.gpu, lease
                job.notice, lease.notice = lease.notice, None
                self.rebalance()  # one more active worker, so that plain jobs keep one
        if job.exclusive:
            self.exclusive_gpus[w.gpu] = job.id
        job.worker, job.dispatched = w, time.time()
        run = job.spec
        run.job, run.lease, run.exclusive, run.client_pid = job.id, job.lease is not None, job.exclusive, job.client_pid
        if job.kind == "script":
            run.keep_env = list(self.config.keep_env)
        w.send(run)
        if job.timeout:
            job.timers.append(loop.call_later(job.timeout, self._timeout, job))
        log.debug("job %s -> worker %s (GPU %d)", job.id, w.id, w.gpu)

    def _timeout(self, job: Job) -> None:
        w = job.worker
        if job.finished or w is None:
            return
        holder = self.gates.holder_pid(w.gpu)
        if job.within is None and not self.gates.is_open(w.gpu) and holder != w.pid:
            # Frozen by someone else's region: that time is not the job's.
            job.timers.append(asyncio.get_running_loop().call_later(0.5, self._timeout, job))
            return
        job.timed_out = True
        w.interrupt()
        job.timers.append(
            asyncio.get_running_loop().call_later(self.config.interrupt_grace, lambda: self._force(job, w, "timeout"))
        )

    def _force(self, job: Job, w: WorkerHandle, reason: str) -> None:
        if not job.finished and job.worker is w:
            job.forced = True
            w.kill(reason)

    def interrupt(self, job: Job, force: bool) -> None:
        if job.finished:
            return
        if job.worker is None:
            self.queue.remove(job)
            code = INTERRUPT_EXIT if job.kind == "script" else None
            self.finish(job, cancelled("cancelled before it started", code))
        elif force:
            self._force(job, job.worker, "interrupt")
        else:
            job.worker.interrupt()

    def client_gone(self, pid: int) -> None:
        """The process that submitted these jobs and owns these leases exited."""
        for job in [j for j in self.jobs.values() if j.client_pid == pid]:
            self.interrupt(job, force=False)
            if job.worker is not None:
                w = job.worker
                force = functools.partial(self._force, job, w, "interrupt")
                job.timers.append(asyncio.get_running_loop().call_later(self.config.interrupt_grace, force))
        for lease in [le for le in self.leases.values() if le.owner_pid == pid]:
            self.release_lease(lease.key)
        if self.forget(pid):
            self.rebalance()

    def finish(self, job: Job, result: JobResult) -> None:
        """Send the job's one result (a second call for the same job does nothing)."""
        if job.finished:
            return
        job.finished = True
        for t in job.timers:
            t.cancel()
        w = job.worker
        if w is not None and self.exclusive_gpus.get(w.gpu) == job.id:
            del self.exclusive_gpus[w.gpu]
        result = completed(job, result, self.config.interrupt_grace)
        self.jobs.pop(job.id, None)
        self.by_rid.pop(job.rid, None)
        if job.lease is not None and job.lease in self.leases:
            lease = self.leases[job.lease]
            lease.pending -= 1
            lease.last_used = time.monotonic()
        self.counters[result.status] += 1
        self.counters["finished"] += 1
        self.emit(job, result)

    # -- leases -----------------------------------------------------------------------------------
    def release_lease(self, key: str) -> bool:
        lease = self.leases.pop(key, None)
        if lease is None:
            return False
        for job in [j for j in self.queue if j.lease == key]:
            self.queue.remove(job)
            self.finish(job, cancelled(f"lease {key!r} was released"))
        w = lease.worker
        if w is not None:
            w.lease = None
            if w.state == "idle":
                self._reset(w)
            else:
                w.reset_pending = True
        self.rebalance()
        return True

    def _reset(self, w: WorkerHandle) -> None:
        w.state = "resetting"
        w.reset_pending = False
        w.send(Reset())

    def expire_leases(self, idle: float) -> None:
        now = time.monotonic()
        for lease in list(self.leases.values()):
            if lease.pending == 0 and idle > 0 and now - lease.last_used > idle:
                log.info("lease %s idle for %.0f s: released", lease.key, now - lease.last_used)
                self.release_lease(lease.key)

    # -- worker events ----------------------------------------------------------------------------
    def on_message(self, w: WorkerHandle, msg: FromWorker) -> None:
        if isinstance(msg, Done):
            job = w.job
            w.drain_output()  # what the job printed goes out before its result
            w.job, w.state = None, "resetting"
            w.jobs_run += 1
            if job is not None:
                self.finish(job, msg.result)
            if msg.recycle:
                self.recycle(w, msg.recycle)
            elif w.for_job is not None:
                self.recycle(w, "it ran the one job of a region it was started for")
        elif isinstance(msg, Ready):
            self._on_ready(w, msg)

    def _on_ready(self, w: WorkerHandle, msg: Ready) -> None:
        w.drain_output()
        if msg.reset_s is not None:
            w.last_reset = {"s": msg.reset_s, **msg.reset_parts_s}
        if msg.first:
            w.info, w.session, w.ready_at = msg, msg.session, time.time()
            self._failures[w.gpu] = 0
            if msg.session_error:
                log.warning("worker %s not registered with the arbiter: %s", w.id, msg.session_error)
            job = w.for_job
            if job is not None and msg.session is None and not job.finished:
                # Not part of the region: it would run frozen, or unchecked. The job fails instead.
                self._fail_region_job(
                    job,
                    f"the job's client runs inside region {job.within}, but its worker "
                    f"could not join that region: {msg.session_error or 'no arbiter'}",
                )
            log.info(
                "worker %s (pid %s, GPU %d) ready in %.2f s; preloaded %s",
                w.id,
                w.pid,
                w.gpu,
                msg.start_s or 0,
                msg.preloaded,
            )
        if w.expected is not None:
            pass  # being killed already
        elif w.for_job is not None and (w.for_job.finished or w.for_job.worker not in (None, w)):
            self.recycle(w, "its region job has ended")
        elif not msg.clean:
            self.recycle(w, f"reset incomplete: {msg.reason}")
        elif w.reset_pending:
            self._reset(w)
        elif w.lease is None and 0 < self.config.max_jobs_per_worker <= w.jobs_run:
            self.recycle(w, f"ran {w.jobs_run} jobs")
        elif w.lease is None and self.stale(w):
            self.recycle(w, "its arbiter session is gone: a new worker registers")
        else:
            w.state = "idle"
        self.rebalance()
        self.dispatch()

    def _fail_region_job(self, job: Job, error: str) -> None:
        """The one result of a job whose own worker (started to join its client's region) cannot run it."""
        if job in self.queue:
            self.queue.remove(job)
        self.finish(
            job, JobResult(ok=False, status="failed", exit_code=1 if job.kind == "script" else None, error=error)
        )

    def on_output(self, w: WorkerHandle, stream: str, text: str) -> None:
        job = w.job
        if job is not None and not job.finished:
            self.emit(
                job, Output(id=job.rid, job=job.id, stream="stderr" if stream == "stderr" else "stdout", text=text)
            )
        else:
            log.debug("worker %s %s: %s", w.id, stream, text.rstrip())

    def on_exit(self, w: WorkerHandle, code: int) -> None:
        self.workers.pop(w.id, None)
        cause = describe_exit(code)
        mine = w.for_job
        if mine is not None and not mine.finished and mine.worker is None:
            self._fail_region_job(
                mine, f"the worker started for this job (inside a region) ended before it ran: {cause}"
            )
        job = w.job
        if job is not None and not job.finished:
            self.finish(job, worker_lost(w, code, cause))
        if w.lease is not None:
            lease = w.lease
            lease.worker = None
            if lease.key in self.leases:
                lease.notice = (
                    f"the worker of lease {lease.key!r} ended ({w.expected or cause}): this job "
                    "ran in a fresh worker, and the lease's earlier namespace is gone"
                )
        if w.expected is None:
            self.counters["deaths"] += 1
            if w.state == "starting" or w.ready_at is None:
                self._start_failed(w, cause)
            else:
                log.warning("worker %s (pid %s, GPU %d) died: %s", w.id, w.pid, w.gpu, cause)
        w.state = "dead"
        self.rebalance()
        self.dispatch()

    def _start_failed(self, w: WorkerHandle, cause: str) -> None:
        n = self._failures[w.gpu] = self._failures.get(w.gpu, 0) + 1
        self._retry_at[w.gpu] = time.monotonic() + min(30.0, 0.5 * 2 ** (n - 1))
        tail = w.last_stderr(40)
        log.error("worker %s on GPU %d failed to start (%s):\n%s", w.id, w.gpu, cause, tail)
        if n < 3:
            return
        failing = {g for g in self.gpus if self._failures[g] >= 3}
        for job in list(self.queue):
            if (job.gpu if job.gpu is not None else -1) in failing or failing >= set(self.gpus):
                self.queue.remove(job)
                self.finish(
                    job,
                    JobResult(
                        ok=False,
                        status="failed",
                        traceback=tail or None,
                        error=f"no worker could start on GPU {w.gpu} ({cause}); see the pool log",
                    ),
                )

    # -- starting workers -------------------------------------------------------------------------
    def _new_worker(self, gpu: int, active: bool, for_job: Job | None = None) -> None:
        self._wids += 1
        cmd, env, init = self.spawn_args(self._wids, gpu)
        if for_job is not None:
            init.within, init.via_ticket = for_job.within or "", for_job.via_ticket
            init.name = f"{init.name} for job {for_job.id} inside region {init.within}"
        w = WorkerHandle(self._wids, gpu, cmd, env, init, self, active)
        w.for_job = for_job
        self.workers[w.id] = w
        self.counters["started"] += 1

        async def start() -> None:
            try:
                await w.start()
            except Exception as exc:
                log.exception("could not start worker %s", w.id)
                self.workers.pop(w.id, None)
                w.state = "dead"
                self._start_failed(w, f"{type(exc).__name__}: {exc}")
                self.rebalance()

        w.start_task = asyncio.get_running_loop().create_task(start())

    # -- status -----------------------------------------------------------------------------------
    def busy(self) -> bool:
        return bool(self.jobs or self.leases)

    def status(self) -> DispatcherTable:
        return dispatcher_status(
            gpus=self.gpus,
            gates=self.gates,
            exclusive_gpus=self.exclusive_gpus,
            workers=self.workers.values(),
            queue=self.queue,
            jobs=self.jobs.values(),
            leases=self.leases.values(),
            counters=self.counters,
            ready=self.ready(),
        )
