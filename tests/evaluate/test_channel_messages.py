"""The channel's bodies are read as their operation's struct: a body of another shape, or another
operation than the one expected, is a ChannelError that says which, on either side."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import msgspec
import pytest

from krex_lab.evaluate.candidate.process import Candidate
from krex_lab.evaluate.channel import Channel, ChannelError
from krex_lab.evaluate.messages import REQUESTS, Drop, Failed, Ok, Returned, Round, Timed


@pytest.fixture
def pair() -> Iterator[tuple[Channel, Channel]]:
    a, b = socket.socketpair()
    with a, b:
        yield Channel(a), Channel(b)


def _raw(chan: Channel, op: str, body: object) -> None:
    """A message as a hostile sender writes it: any op, any body."""
    data = msgspec.msgpack.encode({"op": op, "body": body, "arrays": []})
    chan.sock.sendall(struct.pack("!I", len(data)) + data)


def test_a_body_is_read_as_its_struct(pair: tuple[Channel, Channel]) -> None:
    left, right = pair
    left.send(Timed(samples=[1.5, 2], values=[None], aliased=[[0]], threads=[]))
    env, fds = right.recv()
    assert fds == []
    got = env.read(Timed)
    assert got.samples == [1.5, 2.0] and got.aliased == [[0]]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"samples": "fast", "values": [], "aliased": [], "threads": []}, "samples"),
        ({"samples": [], "values": [], "aliased": [[1, "x"]], "threads": []}, "aliased"),
        ({"samples": [], "values": [], "aliased": [], "threads": 7}, "threads"),
        ({"samples": [], "values": [], "aliased": []}, "threads"),
        ({"samples": [], "values": [], "aliased": [], "threads": [], "extra": 1}, "extra"),
        ([1, 2, 3], "object"),
    ],
)
def test_a_malformed_body_is_a_channel_error_naming_the_field(
    pair: tuple[Channel, Channel], body: object, field: str
) -> None:
    left, right = pair
    _raw(left, "timed", body)
    env, _ = right.recv()
    with pytest.raises(ChannelError, match=r"'timed' message's body is malformed") as info:
        env.read(Timed)
    assert field in str(info.value)


def test_another_operation_than_the_one_expected_is_a_channel_error(pair: tuple[Channel, Channel]) -> None:
    left, right = pair
    left.send(Returned(values=[], aliased=[], threads=[]))
    env, _ = right.recv()
    with pytest.raises(ChannelError, match="a 'timed' message was expected, not 'returned'"):
        env.read(Timed)


def test_every_request_has_its_handler() -> None:
    assert {op for op in REQUESTS if op != "quit"} == {n[3:] for n in dir(Candidate) if n.startswith("op_")}


def test_the_candidates_side_answers_a_malformed_request_and_serves_on(pair: tuple[Channel, Channel]) -> None:
    judge, theirs = pair
    server = threading.Thread(target=Candidate(theirs, "cpu").serve, daemon=True)
    server.start()
    _raw(judge, "round", {"order": "all", "method": "timed"})
    env, _ = judge.recv()
    failed = env.read(Failed)
    assert failed.kind == "ChannelError" and "'round' message's body is malformed" in failed.message
    _raw(judge, "steal", {})
    env, _ = judge.recv()
    assert env.read(Failed).message == "unknown op 'steal'"
    judge.send(Drop())
    env, _ = judge.recv()
    assert env.read(Ok) == Ok()
    judge.send(Round(order=[], method="warmup"))  # no model loaded: the failure is a message
    env, _ = judge.recv()
    assert env.read(Timed).samples == []
    _raw(judge, "quit", {})
    server.join(timeout=10)
    assert not server.is_alive()
