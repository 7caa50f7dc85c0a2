"""The wire: one msgpack map per ZeroMQ message, typed by msgspec structs on both ends.

This module holds what every link shares (the version, the size limit, :class:`Reply` with its
:class:`ErrorBody`, encoding and the request decoder) and the arbiter's own requests and reply
bodies. The pool's requests and messages are in :mod:`krex_lab.workers.wire`, built on the same
pieces.

Requests carry the protocol version ``v``, an ``id`` chosen by the client and an ``op`` that
tags their struct; a server answers each request with exactly one :class:`Reply` with the same
``id``: ``ok`` and a ``result`` (the struct named by the request's ``reply`` class variable), or
an ``error`` whose ``type`` names a class of :mod:`krex_lab.errors`, which the client re-raises.

The arbiter also sends *control* messages (:class:`Control`) to the socket a session
registered from: ``drain`` (synchronise your GPU work and pause), ``resume`` and
``lease_expired``. Events for observers go out on the PUB socket as ``[topic, msgpack]``.

Every failure to decode (bad bytes, a wrong type, a wrong version, nesting too deep) becomes a
:class:`~krex_lab.errors.ProtocolError` with a readable message; messages over
:data:`MAX_MESSAGE` never reach the decoder (the socket's ``MAXMSGSIZE``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, TypedDict, TypeVar, Union

import msgspec

from .errors import KrexError, ProtocolError, RemoteError
from .region_report import RegionReport

VERSION = 2
MAX_MESSAGE = 64 * 1024
ROLES = ("kernel", "worker", "pool", "client", "cli")

T = TypeVar("T")


class Request(msgspec.Struct, tag_field="op", forbid_unknown_fields=True, kw_only=True):
    """Base of every request on every link; ``reply`` is the struct of its result."""

    v: int = VERSION
    id: int = 0
    reply: ClassVar[Any] = dict


class ErrorBody(msgspec.Struct, omit_defaults=True):
    type: str
    message: str
    traceback: str | None = None


class Reply(msgspec.Struct, kw_only=True, omit_defaults=True):
    v: int = VERSION
    id: int | None = None
    ok: bool = True
    result: Any = None
    error: ErrorBody | None = None
    kind: str = "reply"


def error_reply(rid: int | None, error: KrexError) -> Reply:
    """The reply that carries ``error`` as its class (and a remote traceback, if it has one)."""
    tb = error.traceback if isinstance(error, RemoteError) else None
    message = str(error.args[0]) if error.args else type(error).__name__
    return Reply(id=rid, ok=False, error=ErrorBody(type(error).__name__, message, tb))


# -- what a GPU backend says of itself (krex_lab.gpu.base's Capabilities, as data) ---------------
class DriverDetail(TypedDict, total=False):
    """What a backend learnt of its driver while deciding whether it can lock (the NVIDIA backend's;
    empty elsewhere): shown by ``krex status --json`` and ``hello``, read by the tests."""

    #: the arbiter's effective uid (root may lock any user's processes)
    euid: int
    #: the driver has cuCheckpointProcessLock
    checkpoint_api: bool
    #: cuDriverGetVersion's number (13000) and as text ("13.0")
    cuda_driver_version: int
    cuda: str
    #: "all-users" (root) or "same-user"
    lock_scope: str


class CapabilitiesDict(TypedDict):
    """A backend's :class:`Capabilities` as plain data: ``GpuBackend.describe`` makes
    it; ``hello``, ``register`` and the status table carry it."""

    lock: bool
    reason: str
    driver: str
    extra: DriverDetail


class _BackendFields(TypedDict):
    backend: str
    simulated: bool
    capabilities: CapabilitiesDict


class BackendDescription(_BackendFields, total=False):
    """What ``GpuBackend.describe`` says of a backend: the arbiter spreads it into its ``hello``
    (:class:`Info`) and ``register`` (:class:`Registered`) replies and its status table."""

    #: the GPU driver's version, where the backend knows it (NVIDIA)
    driver: str


class Capabilities(msgspec.Struct):
    """Whether the backend can drain another process's GPU work by a driver lock, and why (not)
    (:mod:`krex_lab.gpu.base` re-exports it; it is here so that reading a status table needs no
    backend module)."""

    lock: bool = False
    reason: str = ""
    driver: str = ""
    extra: DriverDetail = msgspec.field(default_factory=lambda: DriverDetail())

    def to_dict(self) -> CapabilitiesDict:
        return CapabilitiesDict(lock=self.lock, reason=self.reason, driver=self.driver, extra=self.extra.copy())


# -- the arbiter's requests -------------------------------------------------------------------------
class SessionRequest(Request, kw_only=True):
    """A request of a registered session (the client's ``Session.call`` fills both in)."""

    session: str = ""
    token: str = ""


class Info(msgspec.Struct, kw_only=True):
    """Who the arbiter is (``hello``), also what a registration answers with."""

    version: str
    protocol: int
    pid: int
    gpus: int
    identity: str  # the UNIX socket that hands out identity tickets (arbiter.identity)
    events: str
    backend: str
    simulated: bool
    capabilities: CapabilitiesDict
    driver: str = ""  # the GPU driver's version, where the backend knows it (NVIDIA)


class InfoDict(TypedDict):
    """:class:`Info` as plain data, what ``client.hello()`` returns (its fields, one for one: a test
    holds them equal)."""

    version: str
    protocol: int
    pid: int
    gpus: int
    identity: str
    events: str
    backend: str
    simulated: bool
    capabilities: CapabilitiesDict
    driver: str


class Registered(msgspec.Struct, kw_only=True):
    session: str
    token: str
    gpu: int
    backend: str
    simulated: bool
    capabilities: CapabilitiesDict
    driver: str = ""


class Placement(msgspec.Struct):
    gpu: int


class Granted(msgspec.Struct, kw_only=True):
    region: str
    gpu: int
    report: RegionReport


class Ended(msgspec.Struct):
    session: str


class Hello(Request, tag="hello"):
    """Who is the arbiter: version, backend, GPUs, its pid."""

    reply = Info


class Status(Request, tag="status"):
    """The node's table: GPUs, holders, queues, sessions (:func:`krex_lab.arbiter.status.node_table`).
    ``ticket`` (an identity ticket) shows the caller's own sessions in full; others' appear as the
    arbiter's privacy setting allows."""

    ticket: str = ""


class Place(Request, tag="place"):
    """Which GPU a new session would get (fewest sessions, then most free memory)."""

    reply = Placement


class Register(Request, tag="register"):
    """Make ``pid`` a session. ``ticket`` comes from the arbiter's identity socket, which learnt the
    caller's pid and uid from the kernel; ``pid`` 0 means that very process (its number in the
    arbiter's pid namespace, which a containerised client does not know), else a process of the
    caller's user."""

    reply = Registered
    pid: int
    ticket: str
    role: str = "client"
    name: str = ""
    gpu: int | None = None
    control: bool = True
    within: str = ""  # a region this process belongs to (its holder started it): KREX_REGION
    #: with ``within``: the identity ticket of a client inside that region, for a pool worker started
    #: for one of its jobs (the worker is not the holder's descendant; the client must be)
    via_ticket: str = ""


class Unregister(SessionRequest, tag="unregister"):
    """End a session (its queued requests are withdrawn, a held region released)."""

    reply = Ended


class RegionSpec(msgspec.Struct, kw_only=True):
    """What a region is asked to be: the options of ``exclusive()``, ``krex exclusive`` and
    ``%%krex_exclusive``, carried from the client to the arbiter's ``Region``. None: the
    arbiter's default (which the arbiter fills in before it makes the region)."""

    #: the GPU (None: the session's)
    gpu: int | None = None
    #: the lease in seconds: the arbiter releases the region after it
    max_hold: float | None = None
    #: stop the GPU's other processes
    freeze: bool = True
    #: reserve CPU cores for the holder
    isolate: bool = True
    #: how many cores to reserve
    cores: int | None = None
    #: processes (with their trees) the region must leave running, e.g. the notebook that
    #: submitted the job this worker runs; they must belong to the session's user
    exempt: list[int] = []


class Acquire(SessionRequest, tag="acquire"):
    """Ask for a region as :class:`RegionSpec` says (on the wire its fields are the request's
    own; a test keeps the two equal). Answered when granted."""

    reply = Granted
    gpu: int | None = None
    max_hold: float | None = None
    freeze: bool = True
    isolate: bool = True
    cores: int | None = None
    exempt: list[int] = []

    @classmethod
    def asking(cls, spec: RegionSpec, **request: Any) -> Acquire:
        """The request for ``spec`` (``request``: the session's fields)."""
        return cls(**msgspec.structs.asdict(spec), **request)

    @property
    def spec(self) -> RegionSpec:
        """What this request asks for."""
        return RegionSpec(**{name: getattr(self, name) for name in RegionSpec.__struct_fields__})


class Release(SessionRequest, tag="release"):
    """Release a held region, or withdraw a queued request for it; answers the final report.
    ``force``: end another session's region or request (root and the admin group only).
    ``leave``: end the session too, before the next region on the GPU is granted (a process on its
    way out is then no sibling of that region, to be drained and frozen)."""

    reply = RegionReport

    region: str
    force: bool = False
    leave: bool = False


class EndRegion(Request, tag="end_region"):
    """End or withdraw any region (root and the admin group only), the caller named by an identity
    ``ticket`` rather than a session: an admin's tool needs no session on a GPU. Answers the final
    report, as :class:`Release` does."""

    reply = RegionReport

    region: str
    ticket: str


class DrainAck(SessionRequest, tag="drain_ack"):
    """A session's answer to a ``drain`` control message: its GPU work is synchronised."""

    region: str


class Regions(Request, tag="regions"):
    """Recent regions with their reports, newest last (``ticket``: as for :class:`Status`)."""

    reply = list
    limit: int = 50
    ticket: str = ""


class History(Request, tag="history"):
    """Finished regions from the arbiter's history database (they outlive arbiter restarts), newest
    last: the last ``limit`` of ``user`` (all users: "") released since ``since`` (epoch seconds).
    ``usage``: instead, GPU-hours held per user, per GPU and per user and GPU in
    ``[since, until)`` (``until`` None: now; ``since`` None: the last 7 days). The reply is a map:
    ``{"rows": [...]}`` or ``{"since", "until", "users", "gpus", "users_gpus"}``, plus ``"by"`` and
    ``"groups"`` when ``by`` names another grouping ("job": Slurm job with its user and account,
    "account"). ``slurm_job``: only that Slurm job's regions. ``ticket``: as for :class:`Status`
    (other users' rows are reduced on a private multi-user arbiter)."""

    reply = dict
    limit: int = 50
    user: str = ""
    since: float | None = None
    until: float | None = None
    usage: bool = False
    ticket: str = ""
    slurm_job: str = ""
    by: str = ""


ArbiterRequest = Union[
    Hello, Status, Place, Register, Unregister, Acquire, Release, EndRegion, DrainAck, Regions, History
]


class Control(msgspec.Struct, kw_only=True):
    """Arbiter -> session, unsolicited."""

    v: int = VERSION
    kind: Literal["drain", "resume", "lease_expired"]
    region: str
    gpu: int


# -- encoding and decoding --------------------------------------------------------------------------
class _Envelope(msgspec.Struct):
    """The fields read before the whole message is trusted to be a request."""

    v: Any = None
    id: Any = None
    op: Any = None
    kind: Any = None


_encoder = msgspec.msgpack.Encoder()
_envelope_decoder = msgspec.msgpack.Decoder(_Envelope)
_reply_decoder = msgspec.msgpack.Decoder(Reply)
_control_decoder = msgspec.msgpack.Decoder(Control)


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)


def _envelope(data: bytes) -> _Envelope:
    try:
        return _envelope_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"not a msgpack map: {exc}") from None
    except RecursionError:
        raise ProtocolError("message nested too deeply") from None


def request_decoder(union: Any, server: str = "arbiter", max_message: int = MAX_MESSAGE) -> Any:
    """A function decoding one request of ``union`` (a Union of :class:`Request` structs), raising
    :class:`ProtocolError` that says what is wrong (version first, so an old client hears that)."""
    decoder = msgspec.msgpack.Decoder(union)

    def decode(data: bytes) -> Request:
        if len(data) > max_message:
            raise ProtocolError(f"message of {len(data)} bytes exceeds the limit of {max_message}")
        envelope = _envelope(data)
        if envelope.v != VERSION:
            raise ProtocolError(
                f"protocol version {envelope.v!r} is not supported: this {server} speaks "
                f"version {VERSION}; upgrade krex-lab on the client side"
            )
        try:
            request: Request = decoder.decode(data)
        except msgspec.ValidationError as exc:
            raise ProtocolError(f"invalid {envelope.op!r} request: {exc}") from None
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"not a msgpack map: {exc}") from None
        except RecursionError:
            raise ProtocolError("message nested too deeply") from None
        return request

    return decode


decode_request = request_decoder(ArbiterRequest)


def request_id(data: bytes) -> int | None:
    """Best-effort ``id`` of a message that failed to decode, so its error reply can be matched."""
    try:
        rid = _envelope(data).id
    except ProtocolError:
        return None
    return rid if isinstance(rid, int) and not isinstance(rid, bool) and -(2**63) <= rid < 2**64 else None


def decode_incoming(data: bytes) -> Reply | Control:
    """Client side of the arbiter link: a reply or a control message."""
    try:
        if _envelope(data).kind not in (None, "reply"):
            return _control_decoder.decode(data)
        return _reply_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"bad message from the arbiter: {exc}") from None


_event_decoder = msgspec.msgpack.Decoder(dict[str, Any])


def decode_event(body: bytes) -> dict[str, Any]:
    """The body of an event from the arbiter's PUB socket (a map; its topic is the first frame)."""
    try:
        event: dict[str, Any] = _event_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise ProtocolError(f"bad event from the arbiter: {exc}") from None
    return event


def result_as(request: Request, result: Any) -> Any:
    """A reply's ``result`` as the struct ``request.reply`` names (validated)."""
    try:
        return msgspec.convert(result, request.reply)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"bad {type(request).__name__} reply: {exc}") from None
