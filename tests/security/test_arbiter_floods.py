"""Floods of a hostile neighbour (issue "Hostile neighbours": one user exhausting the arbiter).

Each test plays the flood for real as ``bob`` (a real unprivileged user) against a root
``krex arbiter --multi-user`` and asserts that it is refused with a clear error, that the
arbiter's descriptors and memory stay bounded, and that another real user still gets service.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

import pytest

from .helpers_arbiter import (
    Agent,
    agents,
    arbiter_pid,
    assert_healthy,
    fd_count,
    kill_tree,
    multi_user_arbiter,
    read_line,
    rss,
    run_as,
    spawn_as,
    status_latency,
)
from .users import User, make_user

MiB = 1 << 20


@pytest.fixture
def alice() -> Iterator[User]:
    with make_user("krexalice") as user:
        yield user


# -- (a) sessions until refused ---------------------------------------------------------------------
REGISTER_FLOOD = r"""
conn = Connection(ENDPOINT)
info = conn.call(protocol.Hello(), timeout=5)
def register(pid):
    try:
        conn.call(protocol.Register(pid=pid, ticket=fetch_ticket(info.identity), control=False), timeout=5)
        return None
    except KrexError as exc:
        return err(exc)
# one pid: until refused
own_ok, own_refusal = 0, None
for _ in range(50):
    own_refusal = register(os.getpid())
    if own_refusal:
        break
    own_ok += 1
# many pids: 200 sleeping children, each registered
kids = [subprocess.Popen(["sleep", "600"]) for _ in range(200)]
kid_ok, kid_refusals = 0, []
for k in kids:
    refusal = register(k.pid)
    if refusal:
        kid_refusals.append(refusal)
    else:
        kid_ok += 1
out(own_ok=own_ok, own_refusal=own_refusal, kid_ok=kid_ok, kid_refusals=kid_refusals[:3],
    refused=len(kid_refusals), types=sorted({r["type"] for r in kid_refusals}))
sys.stdin.readline()  # hold the sessions until the test has looked
for k in kids:
    k.kill()
"""


def test_session_flood_is_refused_by_quota_and_others_still_get_a_region(bob: User, alice: User) -> None:
    with (
        multi_user_arbiter("--Quotas.sessions_per_user=20", "--Quotas.sessions_per_process=8") as arb,
        agents() as made,
    ):
        pid = arbiter_pid(arb)
        fds_before = fd_count(pid)
        flood = spawn_as(bob, arb, REGISTER_FLOOD)
        try:
            result = read_line(flood, timeout=120)
            fds_peak = fd_count(pid)
            # one pid: 8 sessions, then a refusal naming the per-process limit
            assert result["own_ok"] == 8
            assert result["own_refusal"]["type"] == "QuotaExceeded"
            assert "sessions_per_process=8" in result["own_refusal"]["message"]
            # many pids: the per-user limit (20 in all) refuses the rest, each with the same clear error
            assert result["kid_ok"] == 12 and result["refused"] == 188
            assert result["types"] == ["QuotaExceeded"]
            assert "sessions_per_user=20" in result["kid_refusals"][0]["message"]
            status = arb.status()
            assert sum(1 for g in status["gpus"] for s in g["sessions"] if s["uid"] == bob.uid) == 20
            # descriptors: one pidfd per session and a connection or two; 188 refusals cost nothing
            assert fds_peak - fds_before <= 2 * 20 + 16, (fds_before, fds_peak)
            # alice is served while bob sits at his limit
            a = Agent(alice, arb)
            made.append(a)
            assert a.call("register", tag="a", gpu=0)["ok"]
            a.call("acquire", tag="ra", session="a", opts={"gpu": 0, "max_hold": 30, "freeze": False})
            granted = a.event("granted|acquire_failed", "ra")
            assert granted["event"] == "granted", granted
            assert a.call("release", tag="ra")["ok"]
        finally:
            kill_tree(flood.pid)
            flood.wait(10)
        time.sleep(0.3)  # the arbiter reaps bob's sessions through their pidfds
        fds_after = fd_count(pid)
        print(f"arbiter fds: before {fds_before}, peak {fds_peak} (20 sessions of bob), after {fds_after}")
        assert fds_after - fds_before <= 8, "descriptors leaked"
        assert_healthy(arb, {bob.uid, alice.uid})


# -- (b) big messages ---------------------------------------------------------------------------------
BIG_SENDER = r"""
n, size = int(ARGS[0]), int(ARGS[1])
ctx = zmq.Context()
sock = ctx.socket(zmq.DEALER)
sock.setsockopt(zmq.RECONNECT_IVL, 5)
sock.setsockopt(zmq.SNDTIMEO, 10000)
sock.connect(ENDPOINT)
body = b"\x81\xa3pad\xc6" + struct.pack(">I", size) + b"x" * size  # a msgpack map of one 4 MiB string
frame = zmq.Frame(body)
sent = 0
for _ in range(n):
    try:
        sock.send(frame, copy=False)
        sent += 1
    except zmq.Again:
        pass
# a few bytes after the flood, on the same socket: the arbiter answers
answered, t0 = None, time.monotonic()
while time.monotonic() - t0 < 20 and answered is None:
    sock.send(protocol.encode(protocol.Hello(id=7)))
    if sock.poll(500):
        answered = time.monotonic() - t0
out(sent=sent, answered=answered)
sock.close(linger=0)
"""


def test_big_message_flood_is_dropped_unread(bob: User) -> None:
    with multi_user_arbiter() as arb:
        pid = arbiter_pid(arb)
        status_latency(arb, 5)  # warm up
        rss_before = rss(pid)
        t0 = time.monotonic()
        senders = [spawn_as(bob, arb, BIG_SENDER, "200", str(4 * MiB)) for _ in range(3)]
        try:
            results = [read_line(s, timeout=120) for s in senders]
        finally:
            for s in senders:
                kill_tree(s.pid)
                s.wait(10)
        flood_s = time.monotonic() - t0
        latencies = status_latency(arb, 20)
        growth = rss(pid) - rss_before
        median = statistics.median(latencies)
        print(
            f"3 x 200 x 4 MiB in {flood_s:.1f} s: arbiter RSS +{growth / MiB:.1f} MiB, status right after "
            f"first {latencies[0] * 1e3:.1f} ms, median {median * 1e3:.2f} ms; senders: {results}"
        )
        assert all(r["sent"] == 200 for r in results)
        assert all(r["answered"] is not None for r in results), "the arbiter did not answer after the flood"
        assert growth < 100 * MiB
        assert latencies[0] < 0.1 and median < 0.1
        assert_healthy(arb, {bob.uid})


# -- (c) a subscriber that never reads ------------------------------------------------------------
SLOW_SUBSCRIBER = r"""
n, seconds = int(ARGS[0]), float(ARGS[1])
info = Connection(ENDPOINT).call(protocol.Hello(), timeout=5)
ctx = zmq.Context()
subs = []
for _ in range(n):
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.RCVHWM, 1)
    s.setsockopt(zmq.RCVBUF, 4096)
    s.connect(info.events)
    subs.append(s)
out(connected=n)
time.sleep(seconds)  # never reads
out(done=True)
"""


def test_subscriber_that_never_reads_costs_little(bob: User, alice: User) -> None:
    with multi_user_arbiter("--Arbiter.telemetry_interval=0.05") as arb, agents() as made:
        pid = arbiter_pid(arb)
        # some history, so that each telemetry event carries region reports
        a = Agent(alice, arb)
        made.append(a)
        a.call("register", tag="a", gpu=0)
        for i in range(5):
            a.call("acquire", tag=f"r{i}", session="a", opts={"gpu": 0, "max_hold": 30})
            assert a.event("granted|acquire_failed", f"r{i}")["event"] == "granted"
            a.call("release", tag=f"r{i}")
        time.sleep(0.5)
        rss_before = rss(pid)
        sub = spawn_as(bob, arb, SLOW_SUBSCRIBER, "1", "5")
        try:
            assert read_line(sub)["connected"] == 1
            assert read_line(sub, timeout=30)["done"]
            growth = rss(pid) - rss_before
        finally:
            kill_tree(sub.pid)
            sub.wait(10)
        print(f"a subscriber that never read for 5 s (telemetry every 50 ms): arbiter RSS +{growth / MiB:.2f} MiB")
        assert growth < 20 * MiB
        assert statistics.median(status_latency(arb, 20)) < 0.1
        assert_healthy(arb, {bob.uid, alice.uid})


# -- (d) deep nesting ----------------------------------------------------------------------------
NESTED = r"""
sock = zmq.Context().socket(zmq.DEALER)
sock.connect(ENDPOINT)
replies = []
for body in (b"\x84\xa1v\x02\xa2op\xa5hello\xa2id\x01\xa1x" + b"\x91" * 1000 + b"\x01",  # under an extra key
             b"\x83\xa1v\x02\xa2op\xa5hello\xa2id" + b"\x91" * 1000 + b"\x01",  # as the id
             b"\x84\xa1v\x02\xa2op\xa5hello\xa2id\x01\xa1a" + b"\x81\xa1a" * 340 + b"\x01"):  # maps, 1 KB
    sock.send(body)
    if not sock.poll(5000):
        replies.append(None)
        continue
    r = msgspec.msgpack.decode(sock.recv(), type=protocol.Reply)
    replies.append({"ok": r.ok, "type": r.error.type if r.error else None,
                    "message": r.error.message if r.error else None, "size": len(body)})
out(replies=replies)
"""


def test_deeply_nested_small_message_gets_a_protocol_error(bob: User) -> None:
    with multi_user_arbiter() as arb:
        (result,) = run_as(bob, arb, NESTED)
        for reply in result["replies"]:
            assert reply is not None, "no reply to a nested message"
            assert reply["size"] <= 1100
            assert reply["ok"] is False and reply["type"] == "ProtocolError" and reply["message"], reply
        print("nested replies:", [r["message"][:60] for r in result["replies"]])
        assert_healthy(arb, {bob.uid})
