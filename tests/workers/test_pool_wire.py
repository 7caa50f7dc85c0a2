"""The pool's wire, end to end with a real pool process (fake backend, no arbiter): errors raised in
the pool reach PoolClient as their class, and an old protocol hears which version to speak."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zmq

from krex_lab import protocol
from krex_lab.errors import InvalidRequest, ProtocolError
from krex_lab.workers.client import PoolClient
from krex_lab.workers.wire import PoolInfo
from tests.support.pool import PoolProc


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolProc]:
    base = tmp_path_factory.mktemp("wire")
    runtime = base / "rt"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "KREX_RUNTIME_DIR": str(runtime), "KREX_ENDPOINT": f"ipc://{runtime / 'none.sock'}"}
    p = PoolProc(
        env,
        f"ipc://{runtime / 'pool.sock'}",
        "--no-preload",
        "--workers-per-gpu=1",
        "--spares=0",
        "--Pool.fallback_gpus=1",
        log=base / "pool.log",
    )
    p.start()
    yield p
    p.stop()


def raw_request(endpoint: str, message: dict[str, object]) -> protocol.Reply:
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send(msgspec.msgpack.encode(message))
        assert sock.poll(5000), "no reply"
        return msgspec.msgpack.decode(sock.recv(), type=protocol.Reply)
    finally:
        sock.close()


def test_an_error_raised_in_the_pool_arrives_as_its_class(pool: PoolProc) -> None:
    client: PoolClient = pool.client
    with pytest.raises(InvalidRequest, match="GPU 7 is not served by this pool"):
        client.run_code("1", gpu=7)
    assert client.run_code("6 * 7", gpu=0).value == "42"  # the pool (and this client) carry on


def test_ping_answers_a_typed_info(pool: PoolProc) -> None:
    info = pool.client.info
    assert isinstance(info, PoolInfo) and info.pid == pool.proc.pid and info.uid == os.getuid()  # type: ignore[union-attr]
    assert info.gpus == [0]


def test_an_old_protocol_hears_which_version_to_speak(pool: PoolProc) -> None:
    reply = raw_request(pool.endpoint, {"v": 1, "op": "ping", "id": 5})
    assert not reply.ok and reply.id == 5 and reply.error is not None
    assert reply.error.type == ProtocolError.__name__
    assert "protocol version 1" in reply.error.message and f"version {protocol.VERSION}" in reply.error.message


def test_a_malformed_request_gets_a_protocol_error_not_silence(pool: PoolProc) -> None:
    reply = raw_request(pool.endpoint, {"v": protocol.VERSION, "op": "submit", "id": 9, "job": {"kind": "nope"}})
    assert not reply.ok and reply.id == 9 and reply.error is not None and reply.error.type == "ProtocolError"


def test_a_large_payload_crosses_in_one_message(pool: PoolProc, tmp_path: Path) -> None:
    blob = os.urandom(1 << 20)  # above the arbiter's 64 KiB limit: the pool's is its own
    assert pool.client.call(len, blob) == len(blob)
