"""Every message of the pool, as typed msgspec structs: client <-> pool and pool <-> worker.

Client <-> pool (ZeroMQ DEALER -> ROUTER, one msgpack map per message, built on
:mod:`krex_lab.protocol`): each request is a :class:`~krex_lab.protocol.Request` (``v``, ``id``,
``op``) and gets exactly one :class:`~krex_lab.protocol.Reply` with its ``id``; an error crosses
as its class (:func:`krex_lab.errors.error_from_wire`). A :class:`Submit` is answered late: first
an :class:`Accepted`, then any number of :class:`Output` while the job runs, then the reply,
whose ``result`` is the job's one :class:`~krex_lab.workers.results.JobResult`. Binary values
(pickled functions and results) are msgpack ``bin`` fields of the same message.

Pool <-> worker (a socketpair): length-prefixed msgpack of the tagged structs below, ``op``
naming each. Pool -> worker: :class:`Init` (once), :class:`Run`, :class:`Reset`, :class:`Exit`;
worker -> pool: :class:`Ready` (after start and after each reset), :class:`Done` (a job's result).
The worker's stdout and stderr are plain pipes the pool reads.
"""

from __future__ import annotations

import socket
import struct
from typing import Any, Literal, Union

import msgspec

from .. import protocol
from ..errors import ProtocolError
from ..protocol import VERSION, Request
from .results import JobResult

#: the pool's message size limit: a job's payload (a pickled function, its arguments) travels whole.
#: The pool is one user's (its socket is 0600), so a large limit trusts no one new.
MAX_MESSAGE = 256 << 20

JobKind = Literal["code", "call", "script"]


# -- the pool's status table (the ``status`` reply) ------------------------------------------------
class WorkerRow(msgspec.Struct, kw_only=True):
    """One context worker: made by ``WorkerHandle.public``, read by ``krex pool`` users' tools, the
    benchmarks and the tests (its pid, state, what it preloaded)."""

    id: int
    pid: int | None
    gpu: int
    #: starting, idle, busy, resetting, dead
    state: str
    #: "active" (takes jobs), "spare", or "region job" (started for one job inside a region)
    role: str
    #: its arbiter session (None: unregistered)
    session: str | None
    lease: str | None
    job: str | None
    jobs_run: int
    #: when it was started (epoch seconds)
    since: float
    preloaded: list[str]
    #: module -> why it was not preloaded
    skipped: dict[str, str]
    start_s: float | None
    #: module -> seconds its import took
    import_s: dict[str, float]
    #: the last reset's parts -> seconds
    last_reset_s: dict[str, float]


class PoolGpuRow(msgspec.Struct, kw_only=True):
    """One GPU the pool serves: its gate as the arbiter published it, its workers, its queue length."""

    index: int
    #: "open" or "closed" (a region holds the GPU: no job starts there)
    gate: str
    holder_pid: int | None
    #: the exclusive job running there, if any
    exclusive_job: str | None
    workers: list[WorkerRow]
    queued: int


class QueuedRow(msgspec.Struct, kw_only=True):
    """A job waiting for a worker."""

    job: str
    kind: str
    gpu: int | None
    lease: str | None
    waiting_s: float


class RunningRow(msgspec.Struct, kw_only=True):
    """A job on a worker."""

    job: str
    kind: str
    worker: int
    pid: int | None
    gpu: int
    lease: str | None
    running_s: float


class LeaseRow(msgspec.Struct, kw_only=True):
    """A lease: jobs of one key run on one worker, one after another."""

    lease: str
    owner_pid: int | None
    worker: int | None
    gpu: int | None
    #: jobs queued or running
    pending: int


class DispatcherTable(msgspec.Struct, kw_only=True):
    """The dispatcher's part of the table (``Dispatcher.status`` makes it)."""

    gpus: list[PoolGpuRow]
    queue: list[QueuedRow]
    running: list[RunningRow]
    leases: list[LeaseRow]
    #: submitted, ok, died, recycled, deaths ... -> how many
    counters: dict[str, int]
    #: every GPU has its workers up, none starting
    ready: bool


class PoolRow(msgspec.Struct, kw_only=True):
    """The pool process itself and its settings."""

    pid: int
    uid: int
    endpoint: str
    started: float
    on_demand: bool
    #: seconds without work after which it exits (0: never)
    idle_exit_s: float
    #: the arbiter's endpoint while it answers, else None
    arbiter: str | None
    preload: list[str]
    workers_per_gpu: int
    spares_per_gpu: int
    #: the GPU backend ("unknown" until the arbiter or the node answered)
    backend: str
    simulated: bool


class PoolTable(DispatcherTable, kw_only=True):
    """The ``status`` reply: made by ``Pool.status``, read by ``PoolClient.status`` callers (``krex
    run``'s idle-exit check, the benchmarks, the tests)."""

    pool: PoolRow


# -- client -> pool --------------------------------------------------------------------------------
class PoolInfo(msgspec.Struct, kw_only=True):
    """Who the pool is (the ``ping`` reply)."""

    pid: int
    uid: int
    version: str
    endpoint: str
    gpus: list[int]
    backend: str | None = None
    simulated: bool | None = None
    #: why the pool has no arbiter now ("no KREX arbiter answers at ..."), None while it has one
    no_arbiter: str | None = None


class Released(msgspec.Struct):
    released: bool


class JobSpec(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One job: ``code`` (a cell), ``call`` (a cloudpickled ``(fn, args, kwargs)``) or ``script``."""

    kind: JobKind
    gpu: int | None = None
    lease: str | None = None
    exclusive: bool = False
    timeout: float | None = None
    code: str | None = None
    payload: bytes | None = None
    path: str | None = None
    argv: list[str] = []
    cwd: str | None = None
    env: dict[str, str] | None = None
    stdin: bytes | None = None  # a script's whole stdin (None: none, as from /dev/null)


class Ping(Request, tag="ping"):
    reply = PoolInfo


class PoolStatus(Request, tag="status"):
    """Workers per GPU, gates, queue, running jobs, leases, counters (:class:`PoolTable`)."""

    reply = PoolTable


class ReleaseLease(Request, tag="release"):
    reply = Released
    lease: str


class Interrupt(Request, tag="interrupt"):
    """KeyboardInterrupt in a job (``force``: kill its worker); ``job`` is the pool's id, or
    ``target`` the id of the :class:`Submit` request when the client has no job id yet."""

    reply = type(None)
    job: str | None = None
    target: int | None = None
    force: bool = False


class Submit(Request, tag="submit"):
    """Run a job; the reply is its :class:`JobResult` (after :class:`Accepted` and :class:`Output`)."""

    reply = JobResult
    job: JobSpec
    pid: int | None = None  # the submitting process: its jobs and leases end when it exits
    #: the client runs inside this region (its KREX_REGION), proven by ``region_ticket``: an
    #: identity ticket the client itself took from the arbiter, which the job's worker hands on
    #: when it registers, so that the arbiter checks the client is the region holder's descendant
    region: str | None = None
    region_ticket: str | None = None


class Sized(msgspec.Struct):
    #: active workers per GPU the pool keeps now (the largest ask of a live client, within its bounds)
    per_gpu: int


class Size(Request, tag="size"):
    """Keep at least ``per_gpu`` active workers on every GPU while process ``pid`` lives (0: this
    client asks for nothing any more). A batch sizes the pool to its jobs per GPU this way; the
    pool keeps the largest ask of its live clients, at most ``max_workers_per_gpu``.

    ``cap``: keep *at most* ``per_gpu`` (at least 1) while ``pid`` lives, below the pool's own
    ``workers_per_gpu`` and spares too: a batch starved of GPU memory gives back what the
    pool's idle workers hold (their contexts). The smallest live cap holds; 0 lifts this
    client's."""

    reply = Sized
    per_gpu: int
    pid: int
    cap: bool = False


PoolRequest = Union[Ping, PoolStatus, ReleaseLease, Interrupt, Submit, Size]


# -- pool -> client, besides the replies ------------------------------------------------------------
class Accepted(msgspec.Struct, tag_field="kind", tag="accepted", kw_only=True):
    v: int = VERSION
    id: int
    job: str
    queued: int = 0


class Output(msgspec.Struct, tag_field="kind", tag="output", kw_only=True):
    v: int = VERSION
    id: int
    job: str
    stream: Literal["stdout", "stderr"]
    text: str


# -- the short way of ``krex run`` (a plain UNIX socket, JSON frames: client.fast_run) -----------
class FastRun(msgspec.Struct, tag_field="op", tag="run", forbid_unknown_fields=True):
    """Run one script job (the pool answers with :class:`Accepted`, :class:`Output`, then one
    :class:`FastResult` or :class:`FastError`)."""

    job: JobSpec


class FastInterrupt(msgspec.Struct, tag_field="op", tag="interrupt", forbid_unknown_fields=True):
    """KeyboardInterrupt in the connection's job (``force``: kill its worker)."""

    force: bool = False


class FastResult(msgspec.Struct, tag_field="kind", tag="result"):
    """The job's one result."""

    result: JobResult


class FastError(msgspec.Struct, tag_field="kind", tag="error"):
    """The job was refused (``type``: the error's class, as :func:`krex_lab.errors.error_from_wire` reads it)."""

    type: str
    message: str


class _Kind(msgspec.Struct):
    kind: str | None = None


_kind_decoder = msgspec.msgpack.Decoder(_Kind)
_reply_decoder = msgspec.msgpack.Decoder(protocol.Reply)
_stream_decoder = msgspec.msgpack.Decoder(Union[Accepted, Output])


def decode_incoming(data: bytes) -> protocol.Reply | Accepted | Output:
    """Client side: a reply (no ``kind``, or ``"reply"``) or a message about a running job."""
    try:
        if _kind_decoder.decode(data).kind in (None, "reply"):
            return _reply_decoder.decode(data)
        return _stream_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"bad message from the pool: {exc}") from None


#: a client's request, or :class:`ProtocolError` saying what is wrong with it
decode_request = protocol.request_decoder(PoolRequest, server="pool", max_message=MAX_MESSAGE)


# -- pool <-> worker --------------------------------------------------------------------------------
class Init(msgspec.Struct, tag_field="op", tag="init", kw_only=True):
    gpu: int
    parent: int  # the pool's pid: the worker dies with it
    name: str
    preload: list[str] = []
    warmup: bool = True
    real: bool = False
    memory_slack: int = 256 << 20
    #: ``module:function`` names called with the device ("cuda"/"cpu") once torch is preloaded:
    #: how the evaluator's zygote starts off any job's clock without the worker importing the evaluator
    ready_hooks: list[str] = []
    arbiter: str | None = None  # register there as a worker session (None: no arbiter answered)
    arbiter_pid: int | None = None
    #: register as part of this region (empty: an ordinary worker), with ``via_ticket``, the job's
    #: client's identity ticket: the arbiter checks that client is the holder or its descendant
    within: str = ""
    via_ticket: str = ""


class Run(msgspec.Struct, tag_field="op", tag="run", kw_only=True):
    job: str
    kind: JobKind
    lease: bool = False  # keep the namespace afterwards (no reset)
    exclusive: bool = False
    client_pid: int | None = None  # left running by the job's region: it relays the output
    code: str | None = None
    payload: bytes | None = None
    path: str | None = None
    argv: list[str] = []
    cwd: str | None = None
    env: dict[str, str] | None = None
    keep_env: list[str] = []  # placement variables a script's env never overrides
    stdin: bytes | None = None  # a script's stdin (its fd 0 for the run); None: /dev/null


class Reset(msgspec.Struct, tag_field="op", tag="reset"):
    pass


class Exit(msgspec.Struct, tag_field="op", tag="exit"):
    pass


class Ready(msgspec.Struct, tag_field="op", tag="ready", kw_only=True, omit_defaults=True):
    """The worker takes jobs: after its start (``first``) and after each reset or leased job."""

    clean: bool = True
    reason: str | None = None  # why a reset was incomplete
    reset_s: float | None = None
    reset_parts_s: dict[str, float] = {}
    first: bool = False
    pid: int | None = None
    session: str | None = None
    session_error: str | None = None
    preloaded: list[str] = []
    skipped: dict[str, str] = {}
    import_s: dict[str, float] = {}
    register_s: float | None = None
    start_s: float | None = None
    memory: Any = None


class Done(msgspec.Struct, tag_field="op", tag="done", kw_only=True):
    job: str
    result: JobResult
    recycle: str | None = None  # the worker must not take another job (a sticky CUDA error)


ToWorker = Union[Init, Run, Reset, Exit]
FromWorker = Union[Ready, Done]

#: a frame's length, before its msgpack body (the worker side is blocking, the pool's asyncio)
HEADER = struct.Struct(">I")
_encoder = msgspec.msgpack.Encoder()
_to_worker = msgspec.msgpack.Decoder(ToWorker)
_from_worker = msgspec.msgpack.Decoder(FromWorker)

EncodeError = msgspec.EncodeError


def pack(msg: ToWorker | FromWorker) -> bytes:
    """One frame: a 4-byte big-endian length, then the msgpack of ``msg``."""
    body = _encoder.encode(msg)
    return HEADER.pack(len(body)) + body


def recv_to_worker(sock: socket.socket) -> ToWorker | None:
    """Blocking read of one frame (the worker's side); None at EOF."""
    header = _recv_exact(sock, HEADER.size)
    if header is None:
        return None
    body = _recv_exact(sock, HEADER.unpack(header)[0])
    if body is None:
        return None
    msg: ToWorker = _to_worker.decode(body)
    return msg


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def decode_from_worker(body: bytes) -> FromWorker:
    """One frame's body from a worker (the pool reads frames with asyncio: :mod:`.pool.handle`)."""
    try:
        msg: FromWorker = _from_worker.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"bad message from a worker: {exc}") from None
    return msg
