"""A connection flood (hostile neighbours, round two): one user opens thousands of ZeroMQ
connections to the arbiter's sockets and never registers.

libzmq aborts the whole process when its IPC listener's ``accept`` fails with EMFILE, so an
arbiter that lets connections run it out of descriptors dies, and every user's sessions and
regions with it. Each test plays the flood as ``mallory`` (a real unprivileged user) against a
root ``krex arbiter --multi-user`` whose descriptor limit the test lowers (so that the flood
reaches it on this machine) and asserts that the arbiter stays up, refuses the offender's
connections beyond its cap, logs the offender, and still serves ``alice`` at once.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .helpers_arbiter import (
    Agent,
    agents,
    arbiter_pid,
    assert_healthy,
    kill_tree,
    multi_user_arbiter,
    read_line,
    spawn_as,
)
from .users import User

#: the arbiter's descriptor limit in these tests: far below the flood (4 x 5,000 connections)
FD_LIMIT = 4096
FLOODERS = 4
PER_FLOODER = 5000


# One process of mallory's: n DEALER (or SUB) sockets connected to the endpoint, never a request.
FLOOD = r"""
import resource
n, kind, target = int(ARGS[0]), ARGS[1], ARGS[2]
# A login session's soft limit (pam_limits: often 1024) is below the flood: mallory raises hers
# to her hard limit, as any user may.
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = 2 * n + 256
if soft < want:
    resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))
ctx = zmq.Context()
ctx.max_sockets = n + 16
if target == "events":
    target = Connection(ENDPOINT).call(protocol.Hello(), timeout=5).events
else:
    target = ENDPOINT
socks = []
for _ in range(n):
    s = ctx.socket(zmq.SUB if kind == "sub" else zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RECONNECT_IVL, 10)  # come back fast when refused
    if kind == "sub":
        s.setsockopt(zmq.SUBSCRIBE, b"")
    s.connect(target)
    socks.append(s)
out(connected=n)
sys.stdin.readline()  # hold them until the test has looked
for s in socks:
    s.close(linger=0)
ctx.term()
"""


def _lower_fd_limit(pid: int) -> None:
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def _flood(mallory: User, arb: object, kind: str, target: str) -> list:  # type: ignore[type-arg]
    return [spawn_as(mallory, arb, FLOOD, str(PER_FLOODER), kind, target) for _ in range(FLOODERS)]  # type: ignore[arg-type]


def _alice_gets_a_region(alice: User, arb: object, made: list[Agent]) -> float:
    """Seconds from alice's first request (a new process, a new connection) to her grant."""
    a = Agent(alice, arb)  # type: ignore[arg-type]
    made.append(a)
    assert a.call("fork", n=0)["ok"]  # the process is up (its imports done): time the requests only
    t0 = time.monotonic()
    reg = a.call("register", tag="a", gpu=0, timeout=10)
    assert reg["ok"], f"{reg}\n{arb.output()[-3000:]}"  # type: ignore[attr-defined]
    a.call("acquire", tag="ra", session="a", opts={"gpu": 0, "max_hold": 30, "freeze": False}, timeout=10)
    granted = a.event("granted|acquire_failed", "ra", timeout=10)
    took = time.monotonic() - t0
    assert granted["event"] == "granted", granted
    assert a.call("release", tag="ra")["ok"]
    return took


@pytest.mark.parametrize("target", ["arbiter", "events"])
def test_connection_flood_leaves_the_arbiter_up_and_alice_served(mallory: User, alice: User, target: str) -> None:
    with multi_user_arbiter() as arb, agents() as made:
        pid = arbiter_pid(arb)
        _lower_fd_limit(pid)
        kind = "sub" if target == "events" else "dealer"
        flooders = _flood(mallory, arb, kind, target)
        try:
            for f in flooders:
                assert read_line(f, timeout=120)["connected"] == PER_FLOODER
            time.sleep(3)  # the flood lands (and, refused, keeps coming back)
            assert arb.proc is not None and arb.proc.poll() is None, f"the arbiter died:\n{arb.output()[-3000:]}"
            took = _alice_gets_a_region(alice, arb, made)
            print(
                f"{FLOODERS} x {PER_FLOODER} {kind} connections of mallory to {target}: alice's grant in {took:.3f} s"
            )
            assert took < 2.0
            log = arb.output()
            assert mallory.name in log and "refus" in log, log[-3000:]
            # once per burst, not once per connection
            assert log.count(mallory.name) < 20, log[-3000:]
        finally:
            for f in flooders:
                kill_tree(f.pid)
                f.wait(10)
        assert arb.proc is not None and arb.proc.poll() is None, f"the arbiter died:\n{arb.output()[-3000:]}"
        assert_healthy(arb, {mallory.uid, alice.uid})


def test_a_server_under_a_login_default_descriptor_limit_serves_its_user(tmp_path: Path) -> None:
    """A login's descriptor limit is often 1024 (soft and hard): the guard's headroom must leave
    room to serve. It was 1,256 whatever the limit, so a user's pool refused every connection."""
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "KREX_RUNTIME_DIR": str(runtime)}
    env.pop("KREX_ENDPOINT", None)

    def login_limits() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    arb = subprocess.Popen(
        [sys.executable, "-m", "krex_lab.cli", "arbiter", "--backend", "fake", "--no-guardian"],
        env=env,
        preexec_fn=login_limits,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            out = subprocess.run(
                [sys.executable, "-m", "krex_lab.cli", "status", "--json"], env=env, capture_output=True, text=True
            )
            if out.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert out.returncode == 0, out.stdout + out.stderr
        assert json.loads(out.stdout)["gpus"], out.stdout
    finally:
        arb.terminate()
        log = arb.communicate(timeout=30)[0].decode(errors="replace")
    assert "refusing connections" not in log, log[-2000:]
