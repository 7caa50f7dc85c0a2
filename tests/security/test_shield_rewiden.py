"""A neighbour that widens its affinity again during a region does not keep the holder's core.

The affinity shield moves every other thread off a region's reserved cores once, at the grant.
mallory's busy loops (one per core, no KREX session) then call ``sched_setaffinity(0, all
cores)``: before the watch, they were back on alice's reserved core at once for the whole
region, her timing loop lost a third to a half of its core, and her report did not say so. With
``Arbiter.guard_neighbours`` the watch puts them back within a look or two, and one that keeps
widening itself is named in the report (``shield.intrusions``), which is then degraded.
"""

from __future__ import annotations

import pytest

from .helpers_arbiter import multi_user_arbiter
from .rewiden import CPUS, region_beside
from .users import User


@pytest.mark.skipif(len(CPUS) < 2, reason="a shield needs a core to reserve and one to keep")
def test_a_neighbour_that_widens_itself_again_is_put_back_or_named(alice: User, mallory: User) -> None:
    with multi_user_arbiter("--guard-neighbours", "--Arbiter.shield=affinity") as arb:
        plain, _ = region_beside(alice, mallory, arb, "plain")
        once, once_pids = region_beside(alice, mallory, arb, "once")
        always, always_pids = region_beside(alice, mallory, arb, "always")
    # What the holder kept is the CPU time her loop got over its wall time on her reserved core: a
    # neighbour left there (the fault) takes half of it for the whole region. Her loop's rate beside
    # plain loops is printed too, but two 2-second rates on a busy 2-core virtual machine differ by
    # 40% now and then (0.61 beside loops the watch put back within 10 ms, 0.84 beside loops it put
    # back 195 times), and her CPU time does not count the time the machine itself was not run.
    ratio = once["cpu_share"]
    shields = {m: r["report"]["shield"] for m, r in (("plain", plain), ("once", once), ("always", always))}
    print(
        f"holder's CPU share: beside plain loops {plain['cpu_share']:.1%}, beside loops that widen once "
        f"{once['cpu_share']:.1%}, beside loops that always widen {always['cpu_share']:.1%}; her rate beside "
        f"them {plain['rate']:.0f}/s, {once['rate']:.0f}/s, {always['rate']:.0f}/s; intrusions {shields}"
    )
    # no core at all: another arbiter of the node holds the core lock (a test run beside this one)
    assert plain["report"]["cores"], plain["report"]["failures"]
    assert plain["report"]["shield"]["mode"] == "affinity", plain["report"]
    # a neighbour widening itself once keeps <= 15% of the holder's core, or is named
    named_once = {i["pid"] for i in shields["once"].get("intrusions", [])} & set(once_pids)
    assert ratio >= 0.85 or (once["report"]["degraded"] and named_once), (ratio, once["report"])
    # one that widens itself whenever it is put back is named, with its time there, and degrades
    found = [i for i in shields["always"].get("intrusions", []) if i["pid"] in always_pids]
    assert found and always["report"]["degraded"], always["report"]
    assert all(i["user"] == mallory.name and i["seconds"] > 0 for i in found), found
    assert any(mallory.name in f and "reserved cores" in f for f in always["report"]["failures"]), always["report"]
