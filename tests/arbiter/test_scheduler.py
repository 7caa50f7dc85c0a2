"""The region sequence in-process: a real Scheduler with the fake backend, real processes and signals.

No sockets: replies and notifications are recorded, so each test can count them exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from krex_lab.arbiter.journal import Journal, read_outstanding
from krex_lab.arbiter.region import Region, RegionState
from krex_lab.arbiter.scheduler import Enforcement, Scheduler, SchedulerConfig
from krex_lab.arbiter.sessions import Session, SessionTable
from krex_lab.enforcement.drain import Locker
from krex_lab.enforcement.freeze import Freezer
from krex_lab.enforcement.gate import Gate
from krex_lab.enforcement.isolate import CoreBook
from krex_lab.errors import KrexError, RegionCancelled
from krex_lab.gpu import make_backend
from krex_lab.gpu.base import GpuBackend, GpuProcess
from krex_lab.procutil import proc_state
from krex_lab.protocol import RegionSpec


@dataclass
class Recorder:
    """The scheduler's Notifier: remembers every event and control message."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    controls: list[tuple[str, str, str]] = field(default_factory=list)  # (session, kind, region)

    def publish(self, topic: str, data: dict[str, Any]) -> None:
        self.events.append((topic, data))

    def control(self, session: Session, kind: str, region: Region) -> None:
        self.controls.append((session.id, kind, region.id))

    def gates(self) -> list[tuple[bool, str]]:
        return [(d["closed"], d["region"]) for t, d in self.events if t == "gate"]


@dataclass
class Replies:
    """Every reply to one acquire; a request must get exactly one."""

    got: list[tuple[Any, KrexError | None]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, result: Any, error: KrexError | None = None) -> None:
        self.got.append((result, error))
        self.arrived.set()

    async def one(self, timeout: float = 5.0) -> tuple[Any, KrexError | None]:
        await asyncio.wait_for(self.arrived.wait(), timeout)
        await asyncio.sleep(0.05)  # a second reply would arrive now
        assert len(self.got) == 1, self.got
        return self.got[0]


class FailingCores(CoreBook):
    """Isolation that fails the first ``n`` times, as a failing sched_setaffinity would."""

    def __init__(self, n: int = 1) -> None:
        super().__init__()
        self.failures = n

    def isolate(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures > 0:
            self.failures -= 1
            raise OSError("sched_setaffinity failed (injected)")
        return super().isolate(*args, **kwargs)


@dataclass
class World:
    scheduler: Scheduler
    sessions: SessionTable
    notes: Recorder
    journal_path: Path
    sleepers: list[subprocess.Popen[bytes]]

    def session(self, gpu: int = 0, control: bool = False) -> Session:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        self.sleepers.append(proc)
        return self.sessions.add(proc.pid, os.getuid(), "client", f"s{proc.pid}", gpu, b"ctl" if control else None)

    def acquire(self, session: Session, gpu: int = 0, max_hold: float = 30.0) -> tuple[Region, Replies]:
        replies = Replies()
        region = self.scheduler.request(session, RegionSpec(gpu=gpu, max_hold=max_hold, cores=1), replies)
        return region, replies


@contextlib.asynccontextmanager
async def running_world(
    tmp_path: Path,
    sleepers: list[subprocess.Popen[bytes]],
    cores: CoreBook,
    drain_timeout: float = 0.2,
    gpu_processes: Callable[[int], list[GpuProcess]] | None = None,
    backend: GpuBackend | None = None,
    lock_foreign: bool = True,
) -> AsyncIterator[World]:
    """A scheduler on real enforcement steps (the fake backend unless ``backend``); shut down, its
    sessions closed, after."""
    backend = backend or make_backend("fake", 2)
    notes = Recorder()
    journal_path = tmp_path / "journal.jsonl"
    journal = Journal(journal_path)
    holder: dict[str, Scheduler] = {}
    sessions = SessionTable(lambda s: holder["s"].session_gone(s, "holder process exited"))
    steps = Enforcement(
        gate=Gate(notes.publish),
        locker=Locker(backend, 1.0),
        freezer=Freezer(journal.record),
        cores=cores,
        journal=journal,
        gpu_processes=gpu_processes or backend.processes,
        backend_name="fake",
        own_pids=lambda: {os.getpid()},
    )
    config = SchedulerConfig(drain_timeout=drain_timeout, backend_info=backend.describe(), lock_foreign=lock_foreign)
    holder["s"] = Scheduler(2, sessions, steps, notes, config)
    try:
        yield World(holder["s"], sessions, notes, journal_path, sleepers)
    finally:
        await holder["s"].shutdown()
        sessions.close()


@pytest.fixture
async def world(tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]) -> AsyncIterator[World]:
    async with running_world(tmp_path, sleepers, CoreBook()) as w:
        yield w


async def test_queue_is_fifo_per_gpu_and_gpus_are_independent(world: World) -> None:
    a, b, c, d = (world.session() for _ in range(4))
    ra, qa = world.acquire(a)
    rb, qb = world.acquire(b)
    rc, qc = world.acquire(c)
    _, qd = world.acquire(d, gpu=1)
    (granted_a, err), (granted_d, err_d) = await qa.one(), await qd.one()
    assert err is None and err_d is None and granted_a.region == ra.id and granted_d.gpu == 1
    assert [r.id for r in world.scheduler.queues[0]] == [rb.id, rc.id]
    assert not qb.got and not qc.got
    await world.scheduler.release(ra, "released by holder")
    await qb.one()
    assert not qc.got and world.scheduler.active[0] is rb
    await world.scheduler.release(rb, "released by holder")
    await qc.one()
    granted = [
        d["region"] for t, d in world.notes.events if t == "region" and d["event"] == "granted" and d["gpu"] == 0
    ]
    assert granted == [ra.id, rb.id, rc.id]


async def test_hand_over_thaws_then_freezes_again(world: World) -> None:
    a, b, sibling = world.session(), world.session(), world.session()
    ra, qa = world.acquire(a)
    result, _ = await qa.one()
    assert sibling.pid in result.report["frozen"] and proc_state(sibling.pid) == "T"
    assert b.pid in result.report["frozen"]  # the waiter is a sibling too
    rb, qb = world.acquire(b)
    report = await world.scheduler.release(ra, "released by holder")
    assert report["released_by"] == "released by holder" and ra.state is RegionState.RELEASED
    result_b, _ = await qb.one()
    assert sibling.pid in result_b.report["frozen"] and a.pid in result_b.report["frozen"]
    assert proc_state(b.pid) != "T"
    await world.scheduler.release(rb, "released by holder")
    assert {proc_state(s.pid) for s in (a, b, sibling)} <= {"S", "R"}
    assert world.notes.gates() == [(True, ra.id), (False, ra.id), (True, rb.id), (False, rb.id)]
    assert read_outstanding(world.journal_path) == []


async def test_lease_expiry_releases_and_tells_the_holder(world: World) -> None:
    a, b, sibling = world.session(), world.session(), world.session()
    ra, qa = world.acquire(a, max_hold=0.2)
    await qa.one()
    rb, qb = world.acquire(b)
    await qb.one(timeout=3.0)  # granted because a's lease ran out
    assert ra.state is RegionState.RELEASED and ra.released_by == "lease expired"
    assert (a.id, "lease_expired", ra.id) in world.notes.controls
    assert world.scheduler.past(ra.id)["expired"] is True  # type: ignore[index]
    await world.scheduler.release(rb, "released by holder")
    assert proc_state(sibling.pid) != "T"


async def test_a_failing_step_is_undone_and_the_next_waiter_served(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    async with running_world(tmp_path, sleepers, FailingCores(1)) as w:
        a, b, sibling = w.session(), w.session(), w.session()
        ra, qa = w.acquire(a)
        rb, qb = w.acquire(b)
        result, error = await qa.one()
        assert result is None and isinstance(error, KrexError) and "undone" in str(error)
        assert ra.state is RegionState.RELEASED and "enforcement failed" in ra.released_by
        # The freeze that had happened before the failure is undone ...
        assert (await qb.one())[1] is None
        assert w.notes.gates()[:2] == [(True, ra.id), (False, ra.id)]
        await w.scheduler.release(rb, "released by holder")
        assert proc_state(sibling.pid) != "T" and proc_state(a.pid) != "T"
        assert read_outstanding(w.journal_path) == []


async def test_an_exempt_client_is_spared_stopping_never_its_gpu_work(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    # A client that waits for a job's output (exempt) has a child with work on the GPU, and the
    # holder has work of its own there. The fake backend cannot lock: the client's child is
    # named as not drained (the region is degraded); the holder's own work is not named.
    on_gpu: list[int] = []
    async with running_world(
        tmp_path, sleepers, CoreBook(), gpu_processes=lambda gpu: [GpuProcess(p, gpu) for p in on_gpu]
    ) as w:
        holder = w.session()
        parent = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import subprocess, sys, time\n"
                "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                "print(kid.pid, flush=True)\ntime.sleep(60)",
            ],
            stdout=subprocess.PIPE,
        )
        sleepers.append(parent)
        assert parent.stdout is not None
        hog = int(parent.stdout.readline())
        client = w.sessions.add(parent.pid, os.getuid(), "client", "client", 1, None)
        on_gpu[:] = [hog, holder.pid]
        replies = Replies()
        region = w.scheduler.request(holder, RegionSpec(gpu=0, max_hold=30.0, cores=1, exempt=[client.pid]), replies)
        granted, error = await replies.one()
        assert error is None
        report = granted.report
        assert list(report["not_drained"]) == [str(hog)], report["not_drained"]
        assert "cannot lock" in report["not_drained"][str(hog)] and report["degraded"] is True
        assert proc_state(client.pid) != "T", "the exempt client itself keeps running"
        await w.scheduler.release(region, "released by holder")
        os.kill(hog, 9)


async def test_withdrawal_answers_the_waiter_once(world: World) -> None:
    a, b = world.session(), world.session()
    ra, qa = world.acquire(a)
    await qa.one()
    rb, qb = world.acquire(b)
    report = await world.scheduler.release(rb, "withdrawn by the client")
    _, error = await qb.one()
    assert isinstance(error, RegionCancelled) and report["state"] == "released"
    assert not world.scheduler.queues[0] and world.scheduler.active[0] is ra
    assert any(d.get("event") == "withdrawn" and d["region"] == rb.id for t, d in world.notes.events)


async def test_holder_leaving_during_its_grant_gets_exactly_one_reply(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    # A KREX-aware sibling that never answers its drain keeps the grant going for drain_timeout.
    async with running_world(tmp_path, sleepers, CoreBook(), drain_timeout=0.5) as w:
        a, mute = w.session(), w.session(control=True)
        ra, qa = w.acquire(a)
        await asyncio.sleep(0.1)
        assert ra.state is RegionState.GRANTING and (mute.id, "drain", ra.id) in w.notes.controls
        w.scheduler.session_gone(a, "holder process exited")
        _, error = await qa.one()
        assert isinstance(error, RegionCancelled)
        await asyncio.sleep(0.1)
        assert ra.state is RegionState.RELEASED and w.scheduler.active[0] is None
        assert proc_state(mute.pid) != "T" and read_outstanding(w.journal_path) == []


async def test_dead_holder_releases_through_the_session_table(world: World) -> None:
    a, b = world.session(), world.session()
    ra, qa = world.acquire(a)
    await qa.one()
    rb, qb = world.acquire(b)
    world.sleepers[0].kill()  # a's process: its pidfd fires, the table reports the death
    await qb.one(timeout=3.0)
    assert ra.released_by == "holder process exited"
    await world.scheduler.release(rb, "released by holder")


def test_transitions_are_enforced() -> None:
    region = Region(
        id="r1",
        gpu=0,
        session=None,  # type: ignore[arg-type]
        spec=RegionSpec(gpu=0, max_hold=1.0, cores=1),
        reply=lambda *a: None,
    )
    with pytest.raises(RuntimeError, match="queued -> held"):
        region.move(RegionState.HELD)
    region.move(RegionState.GRANTING)
    region.move(RegionState.HELD)
    with pytest.raises(RuntimeError, match="held -> queued"):
        region.move(RegionState.QUEUED)
