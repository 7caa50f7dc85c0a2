"""Fuzz the arbiter's request socket with 10,000 hostile messages over a real DEALER.

Every message that is under the size limit gets exactly one reply (an error, or a valid result for
a valid request); one over the limit is dropped by the socket unread; the arbiter never dies and
answers ``status`` quickly right after. Replies are counted against a sentinel ``hello`` every
few hundred messages (the ROUTER answers one connection's messages in order), so the sends can be
batched and 10,000 examples run in well under a minute.
"""

from __future__ import annotations

import statistics
import struct
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from krex_lab import protocol
from krex_lab.errors import error_classes
from krex_lab.pytest_plugin import ArbiterProc

from .helpers_arbiter import status_latency

LIMIT = protocol.MAX_MESSAGE
V = protocol.VERSION
SENTINEL = 2**62
VALID_OPS = ["hello", "status", "place", "regions"]
OPS = [*VALID_OPS, "register", "unregister", "acquire", "release", "drain_ack"]
FIELDS = [
    "pid",
    "ticket",
    "role",
    "name",
    "gpu",
    "control",
    "within",
    "session",
    "token",
    "max_hold",
    "freeze",
    "isolate",
    "cores",
    "exempt",
    "region",
    "force",
    "limit",
]
KNOWN_ERRORS = set(error_classes())

INT64 = st.integers(-(2**63), 2**63 - 1)
junk: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    INT64,
    st.integers(2**63, 2**64 - 1),
    st.floats(),
    st.text(max_size=16),
    st.binary(max_size=16),
    st.lists(INT64, max_size=4),
    st.dictionaries(st.text(max_size=4), INT64, max_size=3),
)


def _enc(obj: Any) -> bytes:
    return msgspec.msgpack.encode(obj)


def _nested(depth: int, where: str) -> bytes:
    inner = b"\x91" * depth + b"\x01"  # [[[...1]]]
    if where == "id":
        return b"\x83\xa1v" + _enc(V) + b"\xa2op\xa5hello\xa2id" + inner
    return b"\x84\xa1v" + _enc(V) + b"\xa2op\xa5hello\xa2id\x01\xa1x" + inner


def _huge_int(field: str, raw: bytes) -> bytes:
    # a map whose field is a raw msgpack integer: uint64 (0xcf) or int64 (0xd3) at the extremes
    return b"\x83\xa2op\xa6status\xa1v" + _enc(V) + _enc(field) + raw


def _sized(size: int, op: str) -> bytes:
    head = b"\x83\xa1v" + _enc(V) + b"\xa2op" + _enc(op) + b"\xa3pad\xdb"  # str32
    pad = max(0, size - len(head) - 4)
    return head + struct.pack(">I", pad) + b"x" * pad


single: st.SearchStrategy[bytes] = st.one_of(
    st.binary(max_size=300),  # garbage bytes
    st.builds(lambda op, rid: _enc({"v": V, "id": rid, "op": op}), st.sampled_from(VALID_OPS), INT64),  # valid
    st.builds(lambda op, rid: _enc({"v": V, "id": rid, "op": op}), st.text(max_size=12), junk),  # unknown ops, ids
    st.builds(lambda v, op: _enc({"v": v, "id": 1, "op": op}), junk, st.sampled_from(OPS)),  # wrong versions
    st.builds(
        lambda op, f, val: _enc({"v": V, "id": 5, "op": op, f: val}),
        st.sampled_from(OPS),
        st.sampled_from(FIELDS),
        junk,
    ),  # wrong types
    st.builds(
        _huge_int,
        st.sampled_from(["id", "v", "limit"]),
        st.sampled_from([b"\xcf" + b"\xff" * 8, b"\xd3\x80" + b"\x00" * 7, b"\xcf\x80" + b"\x00" * 7]),
    ),
    st.builds(_nested, st.integers(1, 30000), st.sampled_from(["id", "extra"])),  # deep nesting (up to 30 KB)
    st.builds(_enc, junk),  # not a map
    st.builds(_sized, st.integers(LIMIT - 64, LIMIT), st.sampled_from(OPS)),  # just under / at the limit
    st.just(b""),  # an empty frame
)
message: st.SearchStrategy[list[bytes]] = st.one_of(
    single.map(lambda b: [b]),
    single.map(lambda b: [b"", b]),  # a REQ client's envelope
    st.lists(st.binary(max_size=40), min_size=2, max_size=5),  # multi-frame, empty frames among them
    st.builds(lambda n: [_sized(n, "status")], st.integers(LIMIT + 1, 4 * LIMIT)),  # over the limit
)


class Client:
    """One DEALER to the arbiter; counts the replies it is owed and checks them at each sentinel."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.ctx = zmq.Context.instance()
        self.sock = self._connect()
        self.owed = 0
        self.sent = 0
        self.replies = 0
        self.errors: dict[str, int] = {}

    def _connect(self) -> zmq.Socket[bytes]:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        return sock

    def send(self, frames: list[bytes]) -> None:
        self.sent += 1
        if any(len(f) > LIMIT for f in frames):
            # over the limit: the socket drops it and disconnects its sender. A connection of its
            # own, so that nothing queued behind it on the main one is lost with it.
            self.sync()
            other = self._connect()
            other.send_multipart(frames)
            assert not other.poll(10), "an oversized message got an answer"
            other.close()
            return
        self.sock.send_multipart(frames)
        self.owed += 1
        if self.owed >= 250:
            self.sync()

    def sync(self) -> None:
        """Every reply owed has come, exactly one each, before the sentinel's."""
        self.sock.send(_enc({"v": V, "id": SENTINEL, "op": "hello"}))
        got = 0
        while True:
            assert self.sock.poll(10000), f"the arbiter stopped answering ({got} of {self.owed} replies)"
            reply = msgspec.msgpack.decode(self.sock.recv_multipart()[-1], type=protocol.Reply)
            if reply.id == SENTINEL and reply.ok and isinstance(reply.result, dict) and "identity" in reply.result:
                break
            got += 1
            if not reply.ok:
                assert reply.error is not None and reply.error.message
                assert reply.error.type in KNOWN_ERRORS, reply.error
                self.errors[reply.error.type] = self.errors.get(reply.error.type, 0) + 1
        assert got == self.owed, f"{got} replies for {self.owed} messages"
        self.replies += got
        self.owed = 0


@pytest.fixture
def client(arbiter: ArbiterProc) -> Iterator[Client]:
    c = Client(arbiter.endpoint)
    yield c
    c.sock.close()


def test_ten_thousand_hostile_messages(arbiter: ArbiterProc, client: Client) -> None:
    t0 = time.monotonic()

    @settings(
        max_examples=10000, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(message)
    def fuzz(frames: list[bytes]) -> None:
        client.send(frames)

    fuzz()
    client.sync()
    elapsed = time.monotonic() - t0
    assert arbiter.proc is not None and arbiter.proc.poll() is None, "the arbiter died"
    latencies = status_latency(arbiter, 20)
    median = statistics.median(latencies)
    print(
        f"{client.sent} messages in {elapsed:.1f} s, {client.replies} replies (errors: {client.errors}); "
        f"status right after: median {median * 1e3:.2f} ms, max {max(latencies) * 1e3:.2f} ms"
    )
    assert client.sent >= 10000
    assert median < 0.1
    table = arbiter.status()
    assert all(g["holder"] is None and not g["queue"] and not g["sessions"] for g in table["gpus"])
