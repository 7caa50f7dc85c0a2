"""The wire protocol between KREX clients and the arbiter.

Every message is one msgpack map, at most :data:`MAX_MESSAGE` bytes, carrying the protocol
version ``v``. Requests name an ``op`` and carry an ``id`` chosen by the client; the arbiter
answers each request with exactly one :class:`Reply` with the same ``id``: ``ok`` and a
``result``, or an ``error`` whose ``type`` names a class of :mod:`krex_lab.errors`.

The arbiter also sends *control* messages (:class:`Control`) to the socket a session
registered from: ``drain`` (synchronise your GPU work and pause), ``resume`` and
``lease_expired``. Events for observers go out on the PUB socket as ``[topic, msgpack]``.

Schemas are msgspec structs, so decoding validates types; :func:`decode_request` turns every
failure into a :class:`~krex_lab.errors.ProtocolError` with a readable message.
"""

from __future__ import annotations

from typing import Any, Literal, Union

import msgspec

from .errors import ProtocolError

VERSION = 1
MAX_MESSAGE = 64 * 1024
ROLES = ("kernel", "worker", "pool", "client", "cli")


class _Request(msgspec.Struct, tag_field="op", forbid_unknown_fields=True, kw_only=True):
    v: int
    id: int


class _SessionRequest(_Request, kw_only=True):
    session: str
    token: str


class Hello(_Request, tag="hello"):
    """Who is the arbiter: version, backend, GPUs, its pid."""


class Status(_Request, tag="status"):
    """The node's table: GPUs, holders, queues, sessions."""


class Place(_Request, tag="place"):
    """Which GPU a new session would get (fewest sessions, then most free memory)."""


class Register(_Request, tag="register"):
    """Make ``pid`` a session. ``proof`` is a file the client created in the proof dir."""

    pid: int
    uid: int
    proof: str
    role: str = "client"
    name: str = ""
    gpu: int | None = None
    control: bool = True
    within: str = ""  # a region this process belongs to (its holder started it): KREX_REGION


class Unregister(_SessionRequest, tag="unregister"):
    """End a session (its queued requests are withdrawn, a held region released)."""


class Acquire(_SessionRequest, tag="acquire"):
    """Ask for a region on ``gpu`` (default: the session's). Answered when granted."""

    gpu: int | None = None
    max_hold: float | None = None
    freeze: bool = True
    isolate: bool = True
    cores: int | None = None
    #: processes (with their trees) the region must leave running, e.g. the notebook that
    #: submitted the job this worker runs; they must belong to the session's user
    exempt: list[int] = []


class Release(_SessionRequest, tag="release"):
    """Release a held region, or withdraw a queued request for it."""

    region: str


class DrainAck(_SessionRequest, tag="drain_ack"):
    """A session's answer to a ``drain`` control message: its GPU work is synchronised."""

    region: str


class Regions(_Request, tag="regions"):
    """Recent regions with their reports, newest last."""

    limit: int = 50


Request = Union[Hello, Status, Place, Register, Unregister, Acquire, Release, DrainAck, Regions]


class Control(msgspec.Struct, kw_only=True):
    """Arbiter -> session, unsolicited."""

    v: int = VERSION
    kind: Literal["drain", "resume", "lease_expired"]
    region: str
    gpu: int


class ErrorBody(msgspec.Struct):
    type: str
    message: str


class Reply(msgspec.Struct, kw_only=True, omit_defaults=True):
    v: int = VERSION
    id: int | None = None
    ok: bool = True
    result: Any = None
    error: ErrorBody | None = None
    kind: str = "reply"


_request_decoder = msgspec.msgpack.Decoder(Request)
_envelope_decoder = msgspec.msgpack.Decoder(dict)
_reply_decoder = msgspec.msgpack.Decoder(Reply)
_control_decoder = msgspec.msgpack.Decoder(Control)
_encoder = msgspec.msgpack.Encoder()


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)


def decode_request(data: bytes) -> Request:
    """Decode and validate one request, or raise :class:`ProtocolError` saying what is wrong."""
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(data)} bytes exceeds the limit of {MAX_MESSAGE}")
    try:
        envelope = _envelope_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"not a msgpack map: {exc}") from None
    version = envelope.get("v")
    if version != VERSION:
        raise ProtocolError(f"protocol version {version!r} is not supported (this arbiter speaks {VERSION})")
    try:
        return _request_decoder.decode(data)
    except msgspec.ValidationError as exc:
        op = envelope.get("op")
        raise ProtocolError(f"invalid {op!r} request: {exc}") from None


def request_id(data: bytes) -> int | None:
    """Best-effort ``id`` of a message that failed to decode, so its error reply can be matched."""
    try:
        # Bounded by the socket's own size cap (the arbiter sets ZMQ_MAXMSGSIZE).
        envelope = _envelope_decoder.decode(data)
    except (msgspec.DecodeError, ValueError):
        return None
    rid = envelope.get("id")
    return rid if isinstance(rid, int) and not isinstance(rid, bool) and -(2**63) <= rid < 2**64 else None


def decode_incoming(data: bytes) -> Reply | Control:
    """Client side: a reply or a control message."""
    try:
        envelope = _envelope_decoder.decode(data)
        if "kind" in envelope and envelope["kind"] != "reply":
            return _control_decoder.decode(data)
        return _reply_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"bad message from the arbiter: {exc}") from None
