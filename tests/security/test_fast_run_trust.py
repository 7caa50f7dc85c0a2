"""Hostile neighbours of ``krex run``'s short way (the pool's plain socket, ``pool.sock.run``),
with real users: alice's ``krex run`` sends nothing to bob's listener there (it asks the kernel
who listens on the very connection, then goes the full way, which refuses and names bob), and
bob gets nothing from a pool's plain socket, not even its hello, even where the file would let
him connect: the pool reads each connection's credentials first."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import krex_lab.command
from krex_lab.workers.client import fast_run, pool_client, run_cli, run_report, stdin  # noqa: F401 (loaded before a child drops root)
from krex_lab.workers.pool.fast_server import FastServer
from krex_lab.workers.wire import PoolInfo

from . import test_pool_trust
from .test_pool_trust import FakePool
from .users import User, as_user

shared_dir = test_pool_trust.shared_dir  # fixture: a world-writable sticky directory, like /tmp


@pytest.fixture
def fake_pools(bob: User, alice: User, shared_dir: Path) -> Iterator[tuple[FakePool, FakePool]]:
    """bob listening at both of a pool's sockets in a shared sticky directory; on the plain one he
    greets as a pool of alice's would (her uid, a GPU): only the kernel's word tells them apart."""
    zmq_side = FakePool(bob, shared_dir)
    hello = fast_run._frame({"pid": 1, "uid": alice.uid, "gpus": [0], "no_arbiter": None})
    plain = FakePool(bob, shared_dir, "pool.sock" + fast_run.SUFFIX, greeting=hello)
    yield zmq_side, plain
    plain.stop()
    zmq_side.stop()


def test_krex_run_sends_nothing_to_a_foreign_plain_socket(
    fake_pools: tuple[FakePool, FakePool], bob: User, alice: User
) -> None:
    zmq_side, plain = fake_pools
    script_dir = Path(tempfile.mkdtemp(prefix="krex-alice-"))
    os.chown(script_dir, alice.uid, alice.gid)
    script = script_dir / "job.py"
    script.write_text("print('hello')\n")
    os.chown(script, alice.uid, alice.gid)

    def krex_run() -> int:
        krex_lab.command.main(["run", str(script)])  # exits (SystemExit) with krex run's code
        return 0

    env = {"KREX_POOL_ENDPOINT": zmq_side.endpoint, "ALICE_SECRET": "s3cret"}
    code, out, err = as_user(alice, krex_run, env=env)
    assert code == 1 and "hello" not in out, (code, out, err)
    assert f"uid {bob.uid}" in err and "nothing was sent" in err, err
    assert plain.bytes_received() == 0, "krex run sent alice's job (and environment) to bob's plain socket"
    assert zmq_side.bytes_received() == 0


class Recorded:
    """A FastServer of this process's user (root) whose handlers record every call."""

    def __init__(self, path: Path) -> None:
        self.calls: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.server = FastServer(str(path), self._ping, self._submit, self._interrupt)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)

    def _ping(self, request: Any, peer: Any) -> PoolInfo:
        self.calls.append("ping")
        return PoolInfo(pid=os.getpid(), uid=os.getuid(), version="0", endpoint="", gpus=[0])

    def _submit(self, request: Any, peer: Any) -> None:
        self.calls.append("submit")

    def _interrupt(self, request: Any, peer: Any) -> None:
        self.calls.append("interrupt")

    def close(self) -> None:
        async def stop() -> None:  # the server, then every connection it still serves
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def test_the_plain_socket_is_this_users_alone(bob: User, shared_dir: Path) -> None:
    served = Recorded(shared_dir / "pool.sock")
    path = served.server.path
    try:
        assert os.stat(path).st_mode & 0o777 == 0o600
        os.chmod(path, 0o666)  # a permission slip: the credentials check must stand alone

        def connect_as_bob() -> int:
            job = {"kind": "script", "path": "/tmp/x.py", "argv": [], "cwd": "/", "env": {}}
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(5)
                sock.connect(path)
                try:
                    sock.sendall(fast_run._frame({"op": "run", "job": job}))
                except OSError:
                    pass
                received = b""
                try:
                    while data := sock.recv(65536):
                        received += data
                except OSError:
                    pass
            print(len(received), flush=True)
            return 0

        code, out, err = as_user(bob, connect_as_bob)
        assert code == 0 and out.strip() == "0", (code, out, err)  # not even the pool's hello
        assert served.calls == [], served.calls
        # the pool's own user is served (the same server, the same socket)
        own = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        own.settimeout(5)
        own.connect(path)
        assert fast_run._Frames(own).next() is not None and served.calls == ["ping"]
        own.close()
    finally:
        served.close()
