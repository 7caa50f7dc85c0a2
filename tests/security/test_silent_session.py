"""A session that never answers a drain (hostile neighbours, round two): before, it added the
drain timeout (1 s) to every region on its GPU, for every user. Now the first region that misses
its answer marks it silent, and later regions do not wait for it until it answers (it is still
frozen with the others): the drain timeout is spent once per silent session, not per region.
"""

from __future__ import annotations

import time

from .helpers_arbiter import Agent, agents, assert_healthy, kill_tree, multi_user_arbiter, read_line, spawn_as
from .users import User

# bob's session: registered with a control channel, which it never reads (so never answers a drain)
SILENT = r"""
conn = Connection(ENDPOINT)
info = conn.call(protocol.Hello(), timeout=5)
conn.call(protocol.Register(pid=0, ticket=fetch_ticket(info.identity), gpu=0, control=True), timeout=5)
out(registered=True)
sys.stdin.readline()
"""


def test_a_silent_session_costs_the_drain_timeout_once(bob: User, alice: User) -> None:
    with multi_user_arbiter() as arb, agents() as made:
        silent = spawn_as(bob, arb, SILENT)
        try:
            assert read_line(silent)["registered"]
            a = Agent(alice, arb)
            made.append(a)
            assert a.call("register", tag="a", gpu=0)["ok"]
            grants = []
            for i in range(4):
                t0 = time.monotonic()
                a.call("acquire", tag=f"r{i}", session="a", opts={"gpu": 0, "max_hold": 30})
                granted = a.event("granted|acquire_failed", f"r{i}")
                grants.append(time.monotonic() - t0)
                assert granted["event"] == "granted", granted
                # the report still names bob's session as not drained (the region is degraded)
                not_drained = granted["report"]["not_drained"]
                assert any("drain" in why for why in not_drained.values()), granted["report"]
                assert a.call("release", tag=f"r{i}")["ok"]
        finally:
            kill_tree(silent.pid)
            silent.wait(10)
        print("alice's grants beside bob's silent session:", ", ".join(f"{g * 1e3:.0f} ms" for g in grants))
        assert grants[0] >= 0.9, "the first region waits the drain timeout for bob's session"
        assert all(g < 0.5 for g in grants[1:]), grants
        assert_healthy(arb, {bob.uid, alice.uid})
