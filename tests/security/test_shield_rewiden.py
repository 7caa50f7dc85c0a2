"""A neighbour that widens its affinity again during a region does not keep the holder's core.

The affinity shield moves every other thread off a region's reserved cores once, at the grant.
mallory's busy loops (one per core, no KREX session) then call ``sched_setaffinity(0, all
cores)``: before the watch, they were back on alice's reserved core at once for the whole
region, her timing loop lost a third to a half of its rate, and her report did not say so. With
``Arbiter.guard_neighbours`` the watch puts them back within a look or two, and one that keeps
widening itself is named in the report (``shield.intrusions``), which is then degraded.
"""

from __future__ import annotations

import os
import time

import pytest

from krex_lab.pytest_plugin import wait_for

from .helpers_arbiter import kill_tree, multi_user_arbiter, run_as, spawn_as
from .users import User

CPUS = sorted(os.sched_getaffinity(0))

HOLDER = """
import time, krex_lab
seconds = float(ARGS[0])
krex_lab.attach(gpu=0, name="timing")
region = krex_lab.exclusive(gpu=0, isolate=True, cores=1, max_hold=60)
region.acquire()
time.sleep(0.3)  # the neighbours widen themselves meanwhile
n, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < seconds:
    for _ in range(10000):
        pass
    n += 1
rate = n / (time.perf_counter() - t0)
region.release()
report = region.report
out(rate=rate, report=report.to_dict() if hasattr(report, "to_dict") else dict(report))
"""

#: ``plain`` never touches its affinity; ``once`` widens itself again the first time it finds
#: itself narrowed; ``always`` every time
LOOP = """
import os
mode = ARGS[0]
every = os.sched_getaffinity(0)
widened = 0
out(ready=1)
while True:
    for _ in range(20000):
        pass
    if mode != "plain" and os.sched_getaffinity(0) != every and (mode == "always" or not widened):
        os.sched_setaffinity(0, every)
        widened += 1
"""


def _region_beside(alice: User, mallory: User, arb: object, mode: str) -> tuple[dict, list[int]]:
    loops = [spawn_as(mallory, arb, LOOP, mode) for _ in CPUS]  # type: ignore[arg-type]
    try:
        for loop in loops:
            assert loop.stdout is not None
            wait_for(lambda loop=loop: b"ready" in loop.stdout.readline(), timeout=20)  # type: ignore[misc]
        time.sleep(0.2)
        [result] = [r for r in run_as(alice, arb, HOLDER, "2.0") if "rate" in r]  # type: ignore[arg-type]
    finally:
        for loop in loops:
            kill_tree(loop)
    return result, [loop.pid for loop in loops]


@pytest.mark.skipif(len(CPUS) < 2, reason="a shield needs a core to reserve and one to keep")
def test_a_neighbour_that_widens_itself_again_is_put_back_or_named(alice: User, mallory: User) -> None:
    with multi_user_arbiter("--guard-neighbours", "--Arbiter.shield=affinity") as arb:
        plain, _ = _region_beside(alice, mallory, arb, "plain")
        once, once_pids = _region_beside(alice, mallory, arb, "once")
        always, always_pids = _region_beside(alice, mallory, arb, "always")
    ratio = once["rate"] / plain["rate"]
    shields = {m: r["report"]["shield"] for m, r in (("plain", plain), ("once", once), ("always", always))}
    print(
        f"holder's rate: beside plain loops {plain['rate']:.0f}/s, beside loops that widen once "
        f"{once['rate']:.0f}/s ({ratio:.1%}), beside loops that always widen {always['rate']:.0f}/s "
        f"({always['rate'] / plain['rate']:.1%}); intrusions {shields}"
    )
    assert plain["report"]["shield"]["mode"] == "affinity", plain["report"]
    # a neighbour widening itself once keeps <= 15% of the holder's rate, or is named
    named_once = {i["pid"] for i in shields["once"].get("intrusions", [])} & set(once_pids)
    assert ratio >= 0.85 or (once["report"]["degraded"] and named_once), (ratio, once["report"])
    # one that widens itself whenever it is put back is named, with its time there, and degrades
    found = [i for i in shields["always"].get("intrusions", []) if i["pid"] in always_pids]
    assert found and always["report"]["degraded"], always["report"]
    assert all(i["user"] == mallory.name and i["seconds"] > 0 for i in found), found
    assert any(mallory.name in f and "reserved cores" in f for f in always["report"]["failures"]), always["report"]
