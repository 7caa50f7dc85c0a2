"""A job and a lease as the pool tracks them, what the dispatcher is built from, and how a
client's ``Submit`` becomes a :class:`Job`.

The dispatcher (:mod:`.dispatcher`) moves jobs between the queue and workers; this module holds
what it moves and the results it writes for them: :func:`cancelled` (dropped before or while
waiting), :func:`completed` (the one result, stamped with who ran it and when).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, Union

from ...errors import InvalidRequest
from ..results import TIMEOUT_EXIT, JobResult, shell_status
from ..wire import Init, Output, Run, Submit
from .handle import WorkerHandle


@dataclass(frozen=True)
class DispatchConfig:
    """The pool's settings the dispatcher reads (see :class:`~.service.Pool` for each)."""

    workers_per_gpu: int = 1
    spares_per_gpu: int = 1
    max_workers_per_gpu: int = 8
    start_concurrency: int = 2
    interrupt_grace: float = 5.0
    max_jobs_per_worker: int = 0
    #: environment variables that place a worker; a script's environment never overrides them
    keep_env: tuple[str, ...] = ()


class Gates(Protocol):
    """Which GPUs are closed by a region right now (:class:`~.gates.GateWatcher`)."""

    def is_open(self, gpu: int) -> bool: ...
    def holder_pid(self, gpu: int) -> int | None: ...


#: what to run for worker ``wid`` on ``gpu``: command, environment, its Init message
SpawnArgs = Callable[[int, int], "tuple[list[str], dict[str, str], Init]"]
#: a job's message to its client: an Output while it runs, then its one JobResult
Emit = Callable[["Job", Union[Output, JobResult]], None]


@dataclass
class Job:
    id: str
    rid: int  # the id of the client's submit request
    client_pid: int | None
    spec: Run  # what the worker gets (its ``job``, ``lease`` ... are set when it is dispatched)
    client: Any = None  # how the pool answers the client (a service.Peer); opaque here
    gpu: int | None = None
    lease: str | None = None
    exclusive: bool = False
    timeout: float | None = None
    submitted: float = field(default_factory=time.time)
    dispatched: float | None = None
    worker: WorkerHandle | None = None
    finished: bool = False
    timed_out: bool = False
    forced: bool = False
    notice: str | None = None
    #: the region the client runs inside on ``gpu``: the job runs on a worker of its own, started
    #: for it and registered as part of the region (never frozen by it) with ``via_ticket``, the
    #: client's identity ticket
    within: str | None = None
    via_ticket: str = ""
    timers: list[asyncio.TimerHandle] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.spec.kind


@dataclass
class Lease:
    key: str
    owner_pid: int | None
    worker: WorkerHandle | None = None
    gpu: int | None = None
    last_used: float = field(default_factory=time.monotonic)
    notice: str | None = None
    pending: int = 0  # jobs queued or running


def cancelled(error: str, exit_code: int | None = None) -> JobResult:
    return JobResult(ok=False, status="cancelled", error=error, exit_code=exit_code)


def completed(job: Job, result: JobResult, interrupt_grace: float) -> JobResult:
    """``result`` stamped as the job's one result: its ids, worker, GPU and times, its notice; a
    job that timed out says so (whatever its interrupt made of it)."""
    w = job.worker
    result.job_id = job.id
    result.worker_pid = w.pid if w is not None else None
    result.gpu = w.gpu if w is not None else job.gpu
    result.submitted_at, result.dispatched_at, result.finished_at = job.submitted, job.dispatched, time.time()
    result.notice = job.notice
    if job.timed_out and result.status in ("interrupted", "died", "exception", "exit"):
        result.ok, result.status = False, "timeout"
        extra = f"; it ignored the interrupt for {interrupt_grace:g} s and its worker was killed" if job.forced else ""
        result.error = f"timed out after {job.timeout:g} s{extra}"
        if job.kind == "script":
            result.exit_code = TIMEOUT_EXIT
    return result


def worker_lost(w: WorkerHandle, code: int, cause: str) -> JobResult:
    """The result of the job a worker was running when it exited (``code``, ``cause``: its
    :func:`~..results.describe_exit`): killed on an interrupt, or died; its last stderr lines."""
    tail = w.last_stderr()
    if w.expected == "interrupt":
        status, error = "interrupted", f"interrupted: the worker was killed ({cause})"
    else:
        status, error = "died", f"worker died: {cause} [pid {w.pid}, GPU {w.gpu}]"
    return JobResult(
        ok=False,
        status=status,
        error=error,
        exit_code=shell_status(code),
        traceback=f"last lines of the worker's stderr:\n{tail}\n" if tail else None,
    )


def job_of(
    request: Submit,
    peer: Any,
    new_id: Callable[[], str],
    gpus: list[int],
    closed: dict[int, tuple[str | None, int | None]],
    default_timeout: float,
) -> Job:
    """The job a client's ``Submit`` asks for (checked: :class:`InvalidRequest` otherwise).

    ``new_id`` names it once it is checked; ``gpus``: those the pool serves; ``closed``: the
    regions closing its GPUs now (a client that runs inside one of them gets a worker of its own
    that joins it); ``default_timeout``: the pool's, for a job that sets none (0: none)."""
    spec = request.job
    if spec.kind == "code" and spec.code is None:
        raise InvalidRequest("a code job needs its code")
    if spec.kind == "call" and spec.payload is None:
        raise InvalidRequest("a call job needs its payload")
    if spec.kind == "script" and not spec.path:
        raise InvalidRequest("a script job needs its path")
    if spec.gpu is not None and spec.gpu not in gpus:
        raise InvalidRequest(f"GPU {spec.gpu} is not served by this pool (GPUs {gpus})")
    timeout = spec.timeout
    if timeout is None and default_timeout > 0:
        timeout = default_timeout
    run = Run(
        job="",
        kind=spec.kind,
        code=spec.code,
        payload=spec.payload,
        path=spec.path,
        argv=spec.argv,
        cwd=spec.cwd,
        env=spec.env,
        stdin=spec.stdin,
    )
    gpu, within, via = spec.gpu, None, ""
    if request.region and request.region_ticket:
        # The client says it runs inside this region. If the region holds one of our GPUs, the
        # job gets a worker of its own that joins the region (the arbiter checks the claim
        # with the client's ticket); else the job is an ordinary one.
        held = [g for g, (region, _pid) in closed.items() if region == request.region]
        if held and held[0] in gpus and gpu in (None, held[0]) and spec.lease is None:
            gpu, within, via = held[0], request.region, request.region_ticket
    return Job(
        id=new_id(),
        rid=request.id,
        client_pid=request.pid,
        spec=run,
        client=peer,
        gpu=gpu,
        within=within,
        via_ticket=via,
        lease=spec.lease,
        exclusive=spec.exclusive,
        timeout=float(timeout) if timeout else None,
    )
