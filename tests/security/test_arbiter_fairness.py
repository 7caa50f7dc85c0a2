"""Fair share and quotas between real users (issue "Hostile neighbours": one user starving the rest).

``bob`` and ``alice`` are real unprivileged users; their processes register and queue on a root
``krex arbiter --multi-user`` over its real sockets.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from krex_lab import protocol
from krex_lab.client import Session
from krex_lab.errors import NotHolder
from krex_lab.pytest_plugin import wait_for
from tests.support import frozen

from .helpers_arbiter import Agent, agents, assert_healthy, multi_user_arbiter
from .users import User, make_user

NO_ENFORCEMENT = {"freeze": False, "isolate": False}


@pytest.fixture
def alice() -> Iterator[User]:
    with make_user("krexalice") as user:
        yield user


def _queue(arb_status: dict[str, Any], gpu: int) -> list[dict[str, Any]]:
    queue: list[dict[str, Any]] = arb_status["gpus"][gpu]["queue"]
    return queue


def test_quotas_and_fair_share_between_two_users(bob: User, alice: User) -> None:
    with (
        multi_user_arbiter(
            "--Quotas.queued_per_user=4", "--Quotas.max_hold=3600", "--Arbiter.max_hold_limit=7200"
        ) as arb,
        agents() as made,
    ):
        b = Agent(bob, arb)
        made.append(b)
        # 50 sessions on one pid: 8 (sessions_per_process), then QuotaExceeded naming the limit
        outcomes = [b.call("register", tag=f"own{i}", gpu=0) for i in range(50)]
        assert sum(o["ok"] for o in outcomes) == 8
        refused = [o for o in outcomes if not o["ok"]]
        assert len(refused) == 42 and all(o["error"]["type"] == "QuotaExceeded" for o in refused)
        assert all("sessions_per_process=8" in o["error"]["message"] for o in refused)
        for i in range(1, 8):
            assert b.call("close", tag=f"own{i}")["ok"]
        # bob holds GPU 0 for a while (his fair-share usage grows) ...
        b.call("acquire", tag="hold", session="own0", opts={"gpu": 0, "max_hold": 3600, **NO_ENFORCEMENT})
        assert b.event("granted|acquire_failed", "hold")["event"] == "granted"
        time.sleep(1.0)
        # ... and queues queued_per_user long requests behind himself; one more is refused
        kids = b.call("fork", n=5)["pids"]
        for i, kid in enumerate(kids):
            assert b.call("register", tag=f"q{i}", gpu=0, pid=kid)["ok"]
        for i in range(4):
            b.call("acquire", tag=f"q{i}", session=f"q{i}", opts={"gpu": 0, "max_hold": 3600, **NO_ENFORCEMENT})
        # Each session has a connection of its own: the arbiter may read q4's request before q3's
        # (seen: q3 was the one refused). The fifth is the one sent once four are queued.
        wait_for(lambda: len(_queue(arb.status(), 0)) == 4, timeout=10)
        b.call("acquire", tag="q4", session="q4", opts={"gpu": 0, "max_hold": 3600, **NO_ENFORCEMENT})
        over = b.event("acquire_failed", "q4")
        assert over["error"]["type"] == "QuotaExceeded" and "queued_per_user=4" in over["error"]["message"], over
        # the message names the user, not the uid
        assert f"user {bob.name} already has 4 requests waiting" in over["error"]["message"], over
        # alice asks once, behind bob's four
        a = Agent(alice, arb)
        made.append(a)
        assert a.call("register", tag="a", gpu=0)["ok"]
        a.call("acquire", tag="ra", session="a", opts={"gpu": 0, "max_hold": 3600, **NO_ENFORCEMENT})
        deadline = time.monotonic() + 10
        while len(_queue(arb.status(), 0)) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        queue = _queue(arb.status(), 0)
        assert [q["user"] for q in queue] == [bob.name] * 4 + [alice.name]
        # bob releases: alice (least hold time) goes before bob's remaining four
        assert b.call("release", tag="hold")["ok"]
        granted = a.event("granted|acquire_failed", "ra")
        assert granted["event"] == "granted", granted
        assert all(b.poll_event(f"q{i}") is None for i in range(4)), "one of bob's requests went first"
        table = arb.status()
        assert table["gpus"][0]["holder"]["user"] == alice.name
        bobs = _queue(table, 0)
        assert [q["user"] for q in bobs] == [bob.name] * 4
        # bob's four came on four connections, so their order is the order the arbiter read them in
        # (seen: q1 before q0): the first of them in the table is the one the queue moves on to
        next_tag = f"q{kids.index(bobs[0]['pid'])}"
        region = granted["region"]
        # bob may not end alice's region, even with force ...
        denied = b.call("call", session="own0", request={"op": "release", "region": region, "force": True})
        assert not denied["ok"] and denied["error"]["type"] == "PermissionDenied", denied
        assert "krex-admin" in denied["error"]["message"]
        assert arb.status()["gpus"][0]["holder"]["region"] == region
        # ... root may
        root = Session(gpu=1, endpoint=arb.endpoint, name="admin")
        try:
            with pytest.raises(NotHolder):  # without force it is the holder's alone, even for root
                root.call(protocol.Release(region=region))
            report = root.call(protocol.Release(region=region, force=True))
        finally:
            root.close()
        assert report["released_by"] == "ended by admin uid 0"
        # and the queue moves on to bob's first
        assert b.event("granted|acquire_failed", next_tag)["event"] == "granted"
        assert_healthy(arb, {bob.uid, alice.uid})


def test_a_lease_over_the_users_max_hold_is_capped_not_refused(bob: User) -> None:
    """A user's ``max_hold`` quota below the lease asked for (the arbiter's 60 s default, say) caps
    the lease and the report says so; it used to refuse the region."""
    with multi_user_arbiter("--Quotas.max_hold=20") as arb, agents() as made:
        b = Agent(bob, arb)
        made.append(b)
        assert b.call("register", tag="s", gpu=0)["ok"]
        b.call("acquire", tag="long", session="s", opts={"gpu": 0, "max_hold": 60, **NO_ENFORCEMENT})
        granted = b.event("granted|acquire_failed", "long")
        assert granted["event"] == "granted", granted
        report = granted["report"]
        assert report["max_hold_s"] == 20 and report["max_hold_asked_s"] == 60, report
        from krex_lab.region_report import RegionReport

        assert (
            "lease capped at 20 s by this user's max_hold quota (asked 60 s)"
            in RegionReport.from_dict(report).summary()
        )
        assert arb.status()["gpus"][0]["holder"]["max_hold_s"] == 20
        assert b.call("release", tag="long")["ok"]
        assert_healthy(arb, {bob.uid})


def test_intruder_hears_its_registration_and_queues_before_it_is_frozen(bob: User, alice: User) -> None:
    with multi_user_arbiter() as arb, agents() as made:
        b = Agent(bob, arb)
        made.append(b)
        assert b.call("register", tag="b", gpu=1)["ok"]
        b.call("acquire", tag="rb", session="b", opts={"gpu": 1, "max_hold": 60})  # freeze and isolate
        assert b.event("granted|acquire_failed", "rb")["event"] == "granted"
        # a new process of alice's registers on bob's GPU mid-region
        a = Agent(alice, arb)
        made.append(a)
        t0 = time.monotonic()
        reply = a.call("register", tag="a", gpu=1, timeout=5)
        heard = time.monotonic() - t0
        assert reply["ok"], reply
        queued = a.call("acquire", tag="ra", session="a", opts={"gpu": 1, "max_hold": 60}, timeout=5)
        assert queued["ok"]
        deadline = time.monotonic() + 5
        while not _queue(arb.status(), 1) and time.monotonic() < deadline:
            time.sleep(0.02)
        queue = _queue(arb.status(), 1)
        assert [q["user"] for q in queue] == [alice.name] and queue[0]["pid"] == a.pid
        print(f"alice's intruder heard its registration after {heard * 1e3:.0f} ms and queued")
        # queueing stops it at once (it is an intruder in bob's region) ...
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not frozen(a.pid):
            time.sleep(0.02)
        assert frozen(a.pid), "the intruder runs on in bob's region"
        # ... and bob's release resumes it and grants it the GPU. Bob is then a sibling in alice's
        # region and may be frozen before its agent has printed the release reply: read that reply
        # only once alice has released too.
        released = b.send("release", tag="rb")
        assert a.event("granted|acquire_failed", "ra")["event"] == "granted"
        assert a.call("release", tag="ra")["ok"]
        assert b.wait(lambda m: m.get("seq") == released)["ok"]
        assert_healthy(arb, {bob.uid, alice.uid})
