"""A process the region stopped itself, seen on the GPU only later, is locked, not "stopped before".

The case of many evaluations on one GPU: a sibling judge's zygote forks its next spare, which makes
its CUDA context while idle. A region that starts meanwhile stops the spare with its judge's tree;
the context shows on the GPU's list a moment later, while the region holds. The driver's lock hangs
on a stopped process, and the intruder watch refused it as "stopped before the region", which made
the region degraded although nothing ran: the region stopped it itself. Such a process is resumed,
locked and stopped again (still frozen for the rest of the region; thawed, then unlocked, at its end).

Real processes and signals, a real Scheduler; the GPU is the fake backend with a driver lock of its
own (``LockingFake``), its process list set by the test.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from krex_lab.enforcement.isolate import CoreBook
from krex_lab.gpu.base import GpuProcess
from krex_lab.procutil import proc_state
from krex_lab.protocol import RegionSpec

from .test_drain_endings import LockingFake
from .test_scheduler import Replies, running_world

pytestmark = pytest.mark.timeout(60)

#: a judge's stand-in: a sibling session whose child (its "spare") it started before the region
PARENT = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(0.01)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(60)\n"
)


async def _until(cond, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_a_process_the_region_stopped_that_shows_on_the_gpu_later_is_locked_not_degraded(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    backend = LockingFake()
    sibling = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE)
    sleepers.append(sibling)
    assert sibling.stdout is not None
    spare = int(sibling.stdout.readline())
    on_gpu = [sibling.pid]  # the spare has no context yet
    try:
        async with running_world(
            tmp_path, sleepers, CoreBook(), gpu_processes=lambda g: [GpuProcess(p, g) for p in on_gpu], backend=backend
        ) as w:
            w.sessions.add(sibling.pid, os.getuid(), "worker", f"s{sibling.pid}", 0, None)
            holder = w.session()
            replies = Replies()
            region = w.scheduler.request(holder, RegionSpec(gpu=0, max_hold=30.0, cores=1), replies)
            granted, error = await replies.one()
            assert error is None
            assert sibling.pid in backend.locked and spare in granted.report["frozen"], granted.report
            await _until(lambda: proc_state(spare) == "T")
            on_gpu.append(spare)  # its context shows now, while it is stopped
            await _until(lambda: spare in backend.locked or spare in region.drain.not_drained)
            assert region.drain.not_drained == {}, region.drain.not_drained
            await _until(lambda: proc_state(spare) == "T")  # frozen again for the rest of the region
            await asyncio.sleep(0.3)  # the watch looks again: nothing changes
            assert proc_state(spare) == "T" and backend.locked.count(spare) == 1
            report = await w.scheduler.release(region, "released by holder")
            assert report.degraded is False and report.not_drained == {}, report
            assert spare in report.intruders and spare in report.frozen
            # thawed and unlocked at the end, as everything else the region froze and locked
            await _until(lambda: proc_state(spare) not in ("T", "t"))
            assert spare not in backend.locked and sibling.pid not in backend.locked
    finally:
        os.kill(spare, signal.SIGKILL)
