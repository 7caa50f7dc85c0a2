"""Hostile neighbours, item 2: a pool client asks the kernel who serves its endpoint before it
sends anything. bob (a real unprivileged user) runs a fake pool: a ZeroMQ ROUTER in a shared
sticky directory that holds the endpoint's lock and answers ``ping`` with alice's uid; alice (a
second real user) points ``PoolClient``, ``connect(start=True)`` and ``krex run`` at it. Each is
refused with bob's uid named, and the fake pool receives nothing at all (not one byte)."""

from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from krex_lab import cli as krex_cli
from krex_lab.errors import PoolUnavailable
from krex_lab.workers.client import PoolClient
from krex_lab.workers.client import run_cli as _run_cli  # noqa: F401 (loaded before a child drops root)
from krex_lab.workers.client.trust import peer_uid_of_ipc, verify_ipc_endpoint

from .users import User, as_user, make_user

#: bob's fake pool (standard library only: bob may not run the test's interpreter): holds the
#: endpoint's lock (so a client believes a pool serves there), makes its socket connectable by
#: anyone, and records every byte any connection sends (a ZeroMQ greeting, a ping, a job).
FAKE_POOL = r"""
import fcntl, os, select, socket, sys
path, record = sys.argv[1], sys.argv[2]
greeting = bytes.fromhex(sys.argv[3]) if len(sys.argv) > 3 else b""
lock = open(path + ".lock", "a+")
fcntl.flock(lock, fcntl.LOCK_EX)
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(path)
os.chmod(path, 0o777)
listener.listen(16)
print("ready", flush=True)
conns, total = [], 0
while True:
    ready, _, _ = select.select([listener, *conns], [], [])
    for s in ready:
        if s is listener:
            conns.append(listener.accept()[0])
            conns[-1].sendall(greeting)
            continue
        data = s.recv(65536)
        if not data:
            conns.remove(s)
            s.close()
        total += len(data)
        with open(record, "w") as f:
            f.write(str(total))
"""


@pytest.fixture
def alice() -> Iterator[User]:
    with make_user("krexalice") as user:
        yield user


def connect_as_alice(endpoint: str, start: bool) -> Callable[[], int]:
    def fn() -> int:
        try:
            client = PoolClient.connect(endpoint, start=start)
        except PoolUnavailable as exc:
            print("REFUSED", exc, flush=True)
            return 3
        print("CONNECTED", client.info, flush=True)
        client.run_code("print('ran as alice')", timeout=2)
        return 0

    return fn


class FakePool:
    """bob's fake pool in ``shared`` (a 1777 directory), recording into a directory of bob's."""

    def __init__(self, bob: User, shared: Path, name: str = "pool.sock", greeting: bytes = b"") -> None:
        self.path = shared / name
        self.endpoint = f"ipc://{self.path}"
        self.dir = Path(tempfile.mkdtemp(prefix="krex-bob-"))
        os.chown(self.dir, bob.uid, bob.gid)
        self.record = self.dir / "received"
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        self.proc = subprocess.Popen(
            [python, "-c", FAKE_POOL, str(self.path), str(self.record), greeting.hex()],
            user=bob.uid,
            group=bob.gid,
            extra_groups=[],
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "HOME": "/"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 20)
        line = self.proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            self.proc.kill()
            pytest.fail(f"bob's fake pool did not start: {line!r} {self.proc.stderr.read()}")

    def bytes_received(self) -> int:
        time.sleep(0.2)  # let it record what is in flight
        try:
            return int(self.record.read_text() or 0)
        except FileNotFoundError:
            return 0

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)  # bob's record: nothing of the test stays in /tmp


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A world-writable sticky directory, like /tmp."""
    path = Path(tempfile.mkdtemp(prefix="krex-shared-"))
    os.chmod(path, 0o1777)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.fixture
def fake_pool(bob: User, shared_dir: Path) -> Iterator[FakePool]:
    pool = FakePool(bob, shared_dir)
    yield pool
    pool.stop()


@pytest.mark.parametrize("start", ["no-start", "start"])
def test_a_foreign_pool_gets_nothing_from_pool_client(fake_pool: FakePool, bob: User, alice: User, start: str) -> None:
    """``KREX_POOL_ENDPOINT`` in a shared directory, bob listening there: refused, zero bytes sent."""
    code, out, err = as_user(alice, connect_as_alice(fake_pool.endpoint, start == "start"))
    assert code == 3 and out.startswith("REFUSED"), (code, out, err)
    assert f"uid {bob.uid}" in out and "nothing was sent" in out, out
    assert fake_pool.bytes_received() == 0, "bob's fake pool received bytes from alice's client"
    # connect(start=True) started no pool of alice's over bob's endpoint either
    assert not any(p.endswith(".log") for p in os.listdir(fake_pool.path.parent)), os.listdir(fake_pool.path.parent)


def test_krex_run_sends_no_environment_to_a_foreign_pool(fake_pool: FakePool, bob: User, alice: User) -> None:
    script_dir = Path(tempfile.mkdtemp(prefix="krex-alice-"))
    os.chown(script_dir, alice.uid, alice.gid)
    script = script_dir / "job.py"
    script.write_text("print('hello')\n")
    os.chown(script, alice.uid, alice.gid)

    def krex_run() -> int:
        krex_cli.main(["run", str(script)])  # exits (SystemExit) with krex run's code
        return 0

    code, out, err = as_user(alice, krex_run, env={"KREX_POOL_ENDPOINT": fake_pool.endpoint, "ALICE_SECRET": "s3cret"})
    assert code == 1, (code, out, err)
    assert f"uid {bob.uid}" in err and "nothing was sent" in err, err
    assert fake_pool.bytes_received() == 0, "krex run sent alice's job (and environment) to bob's pool"


def test_the_listener_decides_not_the_socket_files_owner(alice: User, shared_dir: Path) -> None:
    # root listens; the socket file is chowned to alice: only SO_PEERCRED can tell.
    path = shared_dir / "chowned.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    os.chown(path, alice.uid, alice.gid)
    listener.setblocking(False)
    try:
        assert peer_uid_of_ipc(str(path)) == 0
        code, out, err = as_user(alice, connect_as_alice(f"ipc://{path}", False))
        assert code == 3 and "served by uid 0" in out, (code, out, err)
        # what the probes sent: nothing (each connection closed without a byte)
        received = b""
        while True:
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                break
            conn.settimeout(1)
            received += conn.recv(100)
            conn.close()
        assert received == b""
    finally:
        listener.close()


def test_a_socket_in_a_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    # Even this user's own listener: another user could swap the path before ZeroMQ connects.
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)  # writable by all, not sticky
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    try:
        sock.bind(f"ipc://{open_dir / 'pool.sock'}")
        with pytest.raises(PoolUnavailable, match="writable by other users"):
            verify_ipc_endpoint(str(open_dir / "pool.sock"))
        with pytest.raises(PoolUnavailable, match="nothing was sent"):
            PoolClient.connect(f"ipc://{open_dir / 'pool.sock'}", start=False)
        assert sock.poll(200) == 0
    finally:
        sock.close(linger=0)


def test_own_listener_is_accepted_in_a_private_or_sticky_directory(tmp_path: Path, shared_dir: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    for where, shared in ((private, False), (shared_dir, True)):
        sock = ctx.socket(zmq.ROUTER)
        try:
            sock.bind(f"ipc://{where / 'own.sock'}")
            peer = verify_ipc_endpoint(str(where / "own.sock"))
            assert (peer.uid, peer.pid, peer.shared_dir) == (os.geteuid(), os.getpid(), shared)
        finally:
            sock.close(linger=0)


def test_tcp_is_refused_unless_allowed() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        with pytest.raises(PoolUnavailable, match="nothing was sent"):
            PoolClient.connect(f"tcp://127.0.0.1:{port}", start=False)
        time.sleep(0.2)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody even connected
    finally:
        listener.close()
