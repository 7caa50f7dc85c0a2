"""Tighter defaults on a shared node (hostile neighbours, round two): a user's flood of short
regions cannot grow the region history without bound (a per-user cap, the oldest dropped), and
one region cannot hold a GPU for an hour by default (a multi-user arbiter's max_hold is 10 min).
"""

from __future__ import annotations

import sqlite3
import time

import pytest

from .helpers_arbiter import Agent, agents, assert_healthy, multi_user_arbiter, run_as
from .users import User

MANY_REGIONS = r"""
s = Session(gpu=1, endpoint=ENDPOINT, name="many")
ids = []
for _ in range(int(ARGS[0])):
    with Exclusive(session=s, gpu=1, max_hold=30, freeze=False, isolate=False) as ex:
        pass
    ids.append(ex.report.region)
out(done=True, ids=ids)
"""


def _rows(db: str, user: str) -> list[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)  # read-only: closing it checkpoints nothing
    try:
        return [r[0] for r in conn.execute("SELECT region FROM regions WHERE user = ? ORDER BY released_at", (user,))]
    finally:
        conn.close()


@pytest.mark.timeout(300)  # the flood (up to 120 s) and the wait for the writer (up to 120 s)
def test_history_keeps_at_most_its_cap_per_user_newest_first(mallory: User, bob: User) -> None:
    with multi_user_arbiter("--Arbiter.history_per_user=20") as arb:
        run_as(bob, arb, MANY_REGIONS, "5")
        (said,) = run_as(mallory, arb, MANY_REGIONS, "60", timeout=120)
        newest = said["ids"][-20:]  # the ids her own regions got, in order
        db = str(arb.runtime / "history.sqlite")
        # the history's writer runs behind the regions (a thread of its own): wait for her last one,
        # not for the count, which reaches 20 while her newest rows are still on their way
        # past the writer's worst case: three attempts of its busy timeout (30 s each) and the
        # sleeps between them (60 s was not: a whole CI run once stopped waiting 23 rows short)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and newest[-1] not in _rows(db, mallory.name):
            time.sleep(0.5)
        time.sleep(0.5)  # the cap's delete follows the insert in the writer
        mine = _rows(db, mallory.name)
        # the newest kept: her last 20 of her 60
        assert sorted(mine, key=lambda r: int(r[1:])) == sorted(newest, key=lambda r: int(r[1:])), (mine, newest)
        assert len(_rows(db, bob.name)) == 5, "another user's rows are not dropped"
        assert_healthy(arb, {mallory.uid, bob.uid})


def test_a_multi_user_arbiter_caps_a_lease_at_ten_minutes_by_default(mallory: User) -> None:
    with multi_user_arbiter() as arb, agents() as made:
        m = Agent(mallory, arb)
        made.append(m)
        assert m.call("register", tag="m", gpu=0)["ok"]
        m.call("acquire", tag="long", session="m", opts={"gpu": 0, "max_hold": 3000, "freeze": False})
        capped = m.event("granted|acquire_failed", "long")
        # capped, not refused: a user's max_hold (600 s by default here) is a cap on the lease
        assert capped["event"] == "granted", capped
        assert capped["report"]["max_hold_s"] == 600 and capped["report"]["max_hold_asked_s"] == 3000, capped
        assert m.call("release", tag="long")["ok"]
        m.call("acquire", tag="ok", session="m", opts={"gpu": 0, "max_hold": 600, "freeze": False})
        assert m.event("granted|acquire_failed", "ok")["event"] == "granted"
        assert m.call("release", tag="ok")["ok"]
        assert_healthy(arb, {mallory.uid})
