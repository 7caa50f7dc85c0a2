"""A holder's timing loop beside a neighbour's busy loops that widen their affinity again: the
scenario of tests/security/test_shield_rewiden.py and benchmarks/regions/rewiden.py (real users against
a real root arbiter)."""

from __future__ import annotations

import os
import time
from typing import Any

from krex_lab.pytest_plugin import ArbiterProc

from .helpers_arbiter import kill_tree, read_line, run_as, spawn_as
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
n, t0, c0 = 0, time.perf_counter(), time.thread_time()
while time.perf_counter() - t0 < seconds:
    for _ in range(10000):
        pass
    n += 1
wall = time.perf_counter() - t0
rate, cpu_share = n / wall, (time.thread_time() - c0) / wall
region.release()
report = region.report
out(rate=rate, cpu_share=cpu_share, report=report.to_dict() if hasattr(report, "to_dict") else dict(report))
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


def region_beside(
    alice: User, mallory: User, arb: ArbiterProc, mode: str, seconds: float = 2.0
) -> tuple[dict[str, Any], list[int]]:
    """alice's region (one reserved core) timing a loop for ``seconds`` beside one of mallory's
    loops per core in ``mode`` (see :data:`LOOP`): her result (``rate`` a second, ``cpu_share``:
    the CPU time her loop got over its wall time, and ``report``) and the loops' pids."""
    loops = [spawn_as(mallory, arb, LOOP, mode) for _ in CPUS]
    try:
        for loop in loops:  # one that dies says why (its stderr), not just that it never got ready
            assert read_line(loop, timeout=20).get("ready"), f"mallory's loop {loop.pid} did not start"
        time.sleep(0.2)
        [result] = [r for r in run_as(alice, arb, HOLDER, str(seconds)) if "rate" in r]
    finally:
        for loop in loops:
            kill_tree(loop)
    return result, [loop.pid for loop in loops]


def diagnosis(arb: ArbiterProc, results: dict[str, tuple[dict[str, Any], list[int]]]) -> str:
    """What a failed run needs to be understood from its output alone: the arbiter's guard and
    shield as it reports them (the mode chosen and why), the environment that chose them, each
    region's rate and shield report (the watch's intrusions), and the arbiter's last log lines."""
    from krex_lab.enforcement.shield import CpusetPartition

    lines = [
        f"env: KREX_GUARD_NEIGHBOURS={os.environ.get('KREX_GUARD_NEIGHBOURS')!r} "
        f"KREX_TEST_SHIELD={os.environ.get('KREX_TEST_SHIELD')!r} euid {os.geteuid()} cpus {len(CPUS)} "
        f"PYTHONPATH={os.environ.get('PYTHONPATH')!r}",
        f"cpuset partitions from the test process: {CpusetPartition().reason or 'available'}",
        f"arbiter command: {arb.extra}",
    ]
    try:
        row = arb.status()["arbiter"]
        lines.append(
            f"arbiter: guard_neighbours {row.get('guard_neighbours')}, shield {row.get('shield')!r}, "
            f"cgroups {row.get('cgroups')!r}"
        )
    except Exception as exc:  # an arbiter that no longer answers: its log below says why
        lines.append(f"arbiter status: {type(exc).__name__}: {exc}")
    for mode, (result, pids) in results.items():
        report = result["report"]
        lines.append(
            f"{mode}: rate {result['rate']:.0f}/s, loops {pids}, cores {report.get('cores')}, degraded "
            f"{report.get('degraded')}, failures {report.get('failures')}, shield {report.get('shield')}"
        )
    lines.append("--- the arbiter's log, last lines ---")
    lines.extend(arb.output().splitlines()[-60:])
    return "\n".join(lines)
