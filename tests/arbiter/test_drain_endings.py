"""A process that ends while a region drains it is gone, not a failure of the region.

Real processes (zombies, exits, signals) and a real Scheduler; the GPU is the fake backend, here and
there given a driver lock of its own (``LockingFake``) so that the lock path runs without a GPU.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from krex_lab.enforcement.isolate import CoreBook
from krex_lab.errors import BackendError
from krex_lab.gpu.base import Capabilities, GpuProcess
from krex_lab.gpu.fake import FakeBackend
from krex_lab.procutil import exited_or_exiting, proc_state
from krex_lab.protocol import RegionSpec

from .test_scheduler import Replies, running_world

pytestmark = pytest.mark.timeout(60)


class LockingFake(FakeBackend):
    """Simulated GPUs with a driver lock: ``lock`` succeeds, but for pids in ``refuse``, which it
    refuses as the driver would (after running ``on_refuse``, e.g. the process's exit)."""

    def __init__(self) -> None:
        super().__init__(2)
        self.refuse: dict[int, str] = {}
        self.on_refuse: dict[int, object] = {}
        self.locked: list[int] = []

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(lock=True, driver="simulated lock (tests)")

    def lock(self, pid: int, timeout_s: float, checked: bool = False) -> str:
        if pid in self.refuse:
            action = self.on_refuse.get(pid)
            if callable(action):
                action()
            raise BackendError(self.refuse[pid])
        self.locked.append(pid)
        return "locked"

    def unlock(self, pid: int, checked: bool = False) -> None:
        if pid in self.locked:
            self.locked.remove(pid)


@pytest.fixture
def zombie() -> Iterator[int]:
    """A child that has exited and is not reaped: still in /proc (state Z), still listed."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while proc_state(proc.pid) != "Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.01)
    yield proc.pid
    proc.wait()


async def test_a_process_that_exited_but_is_listed_makes_no_region_degraded(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]], zombie: int
) -> None:
    on_gpu = [zombie]
    async with running_world(
        tmp_path, sleepers, CoreBook(), gpu_processes=lambda g: [GpuProcess(p, g) for p in on_gpu]
    ) as w:
        holder = w.session()
        replies = Replies()
        region = w.scheduler.request(holder, RegionSpec(gpu=0, max_hold=30.0, cores=1), replies)
        granted, error = await replies.one()
        assert error is None
        report = granted.report
        assert report["not_drained"] == {} and report["degraded"] is False, report
        assert zombie in report["gone"]
        await w.scheduler.release(region, "released by holder")


@pytest.mark.parametrize("lock_foreign", [True, False])
async def test_with_a_driver_lock_an_exited_process_is_gone_whatever_lock_foreign_says(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]], zombie: int, lock_foreign: bool
) -> None:
    backend = LockingFake()
    on_gpu = [zombie]
    async with running_world(
        tmp_path,
        sleepers,
        CoreBook(),
        gpu_processes=lambda g: [GpuProcess(p, g) for p in on_gpu],
        backend=backend,
        lock_foreign=lock_foreign,
    ) as w:
        holder = w.session()
        replies = Replies()
        region = w.scheduler.request(holder, RegionSpec(gpu=0, max_hold=30.0, cores=1), replies)
        granted, error = await replies.one()
        assert error is None
        report = granted.report
        assert report["degraded"] is False and report["not_drained"] == {}, report
        assert not any("lock_foreign" in why for why in report["not_drained"].values())
        await w.scheduler.release(region, "released by holder")


async def test_a_process_that_exits_during_its_lock_is_gone_not_a_failed_lock(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    backend = LockingFake()
    leaving = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    sleepers.append(leaving)
    # The driver refuses the lock of a process whose context is being torn down: here the
    # process is killed as its lock is asked, and the refusal arrives before the exit shows.
    backend.refuse[leaving.pid] = "cuCheckpointProcessLock failed with CUDA_ERROR_INVALID_VALUE (1)"
    backend.on_refuse[leaving.pid] = lambda: os.kill(leaving.pid, signal.SIGKILL)
    on_gpu = [leaving.pid]
    async with running_world(
        tmp_path, sleepers, CoreBook(), gpu_processes=lambda g: [GpuProcess(p, g) for p in on_gpu], backend=backend
    ) as w:
        holder = w.session()
        replies = Replies()
        region = w.scheduler.request(holder, RegionSpec(gpu=0, max_hold=30.0, cores=1), replies)
        granted, error = await replies.one()
        assert error is None
        report = granted.report
        assert report["degraded"] is False and report["not_drained"] == {}, report
        assert report["no_lock_needed"] == {str(leaving.pid): "gone"}
        assert exited_or_exiting(leaving.pid)
        await w.scheduler.release(region, "released by holder")


async def test_a_lock_refused_for_a_living_process_says_why_and_degrades_the_region(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    backend = LockingFake()
    stays = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    sleepers.append(stays)
    backend.refuse[stays.pid] = "cuCheckpointProcessLock failed with CUDA_ERROR_NOT_PERMITTED (800)"
    foreign = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    sleepers.append(foreign)
    on_gpu = [stays.pid, foreign.pid]
    async with running_world(
        tmp_path,
        sleepers,
        CoreBook(),
        gpu_processes=lambda g: [GpuProcess(p, g) for p in on_gpu],
        backend=backend,
        lock_foreign=False,
    ) as w:
        holder = w.session()
        w.sessions.add(stays.pid, os.getuid(), "client", "stays", 0, None)
        replies = Replies()
        region = w.scheduler.request(holder, RegionSpec(gpu=0, max_hold=30.0, cores=1), replies)
        granted, error = await replies.one()
        assert error is None
        report = granted.report
        assert report["degraded"] is True
        assert report["not_drained"][str(stays.pid)] == (
            "lock failed: cuCheckpointProcessLock failed with CUDA_ERROR_NOT_PERMITTED (800)"
        )
        # Not a session's, and lock_foreign is off: that, and only that, is said of the other.
        assert "lock_foreign is off" in report["not_drained"][str(foreign.pid)]
        await w.scheduler.release(region, "released by holder")
        assert proc_state(stays.pid) != "T"
