"""A holder's timing loop beside a neighbour's busy loops that widen their affinity again: the
scenario of tests/security/test_shield_rewiden.py and benchmarks/rewiden.py (real users against
a real root arbiter)."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

from krex_lab.pytest_plugin import ArbiterProc, wait_for

from .helpers_arbiter import kill_tree, run_as, spawn_as
from .users import User

MODES = ("plain", "once", "always")

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


def _ready(readline: Callable[[], bytes]) -> bool:
    return b"ready" in readline()


def region_beside(
    alice: User, mallory: User, arb: ArbiterProc, mode: str, seconds: float = 2.0
) -> tuple[dict[str, Any], list[int]]:
    """alice's region (one reserved core) timing a loop for ``seconds`` beside one of mallory's
    loops per core in ``mode`` (see :data:`LOOP`): her result (``rate`` a second and ``report``)
    and the loops' pids."""
    loops = [spawn_as(mallory, arb, LOOP, mode) for _ in CPUS]
    try:
        for loop in loops:
            assert loop.stdout is not None
            wait_for(functools.partial(_ready, loop.stdout.readline), timeout=20)
        time.sleep(0.2)
        [result] = [r for r in run_as(alice, arb, HOLDER, str(seconds)) if "rate" in r]
    finally:
        for loop in loops:
            kill_tree(loop)
    return result, [loop.pid for loop in loops]
