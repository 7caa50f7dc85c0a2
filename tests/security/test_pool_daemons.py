"""Hostile neighbours, item 8: a pool job that daemonises (``setsid`` + double fork) is gone when
its job ends, when its worker dies, and when the pool is stopped. Real arbiter (fake backend),
real pool, real worker processes; the daemon is a real ``sleep`` re-parented away from the job."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from krex_lab.pytest_plugin import ArbiterProc, running_arbiter
from krex_lab.workers.client import PoolClient
from krex_lab.workers.results import JobResult
from tests.support.pool import PoolProc, alive


def daemonise(pidfile: Path, then: str = "") -> str:
    """Cell code: double-fork a ``sleep 600`` daemon in its own session, write its pid, then ``then``."""
    return (
        "import os, time\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        fd = os.open('/dev/null', os.O_RDWR)\n"
        "        for n in (0, 1, 2):\n"
        "            os.dup2(fd, n)\n"
        f"        with open({str(pidfile)!r} + '.tmp', 'w') as f:\n"
        "            f.write(str(os.getpid()))\n"
        f"        os.rename({str(pidfile)!r} + '.tmp', {str(pidfile)!r})\n"
        "        os.execv('/bin/sleep', ['sleep', '600'])\n"
        "    os._exit(0)\n"
        "os.waitpid(child, 0)\n"
        f"while not os.path.exists({str(pidfile)!r}):\n"
        "    time.sleep(0.01)\n"
        f"{then}\n"
    )


def read_pid(pidfile: Path, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while not pidfile.exists():
        assert time.monotonic() < deadline, f"the job wrote no daemon pid to {pidfile}"
        time.sleep(0.01)
    return int(pidfile.read_text())


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture(scope="module")
def arb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArbiterProc]:
    base = tmp_path_factory.mktemp("daemons")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KREX_POOL_ENDPOINT", f"ipc://{base / 'rt' / 'pool.sock'}")
        yield from running_arbiter(base, mp, gpus=1)


def start_pool(arb: ArbiterProc, name: str) -> PoolProc:
    return PoolProc(
        arb.env(),
        f"ipc://{arb.runtime / name}",
        "--no-preload",
        "--workers-per-gpu=1",
        "--spares=1",
        "--Pool.interrupt_grace=1.0",
        "--debug",
        log=arb.runtime / f"{name}.log",
    ).start()


@pytest.fixture(scope="module")
def pool(arb: ArbiterProc) -> Iterator[PoolProc]:
    p = start_pool(arb, "daemons.sock")
    yield p
    p.stop()


@pytest.fixture
def client(pool: PoolProc) -> PoolClient:
    pool.wait_ready()
    return pool.client


@pytest.fixture
def daemons() -> Iterator[list[int]]:
    """Daemon pids a test saw; any still alive at the end is killed (and the test has failed)."""
    seen: list[int] = []
    yield seen
    for pid in seen:
        if alive(pid):
            os.kill(pid, 9)


def test_a_daemon_ends_with_its_job(client: PoolClient, tmp_path: Path, daemons: list[int]) -> None:
    pidfile = tmp_path / "daemon.pid"
    # The cell's value: the daemon, seen from inside the job, left the job's session (a real daemon).
    left = f"os.getsid(int(open({str(pidfile)!r}).read())) != os.getsid(0)"
    result = client.run_code(daemonise(pidfile, left))
    assert result.ok and result.value == "True", result
    pid = read_pid(pidfile)
    daemons.append(pid)
    assert gone_within(pid, 2.0), f"daemon {pid} of a finished job is still alive"
    # The worker survives its job's cleanup and serves the next one (the pool stays full).
    again = client.run_code("1 + 1")
    assert again.ok and again.value == "2", again


def test_a_leased_jobs_daemon_ends_with_that_job_too(client: PoolClient, tmp_path: Path, daemons: list[int]) -> None:
    pidfile = tmp_path / "leased.pid"
    try:
        result = client.run_code(daemonise(pidfile, "x = 1"), lease="daemon-lease")
        assert result.ok, result
        pid = read_pid(pidfile)
        daemons.append(pid)
        assert gone_within(pid, 2.0), f"daemon {pid} of a leased job outlived the job"
        kept = client.run_code("x", lease="daemon-lease")  # the lease's namespace is intact
        assert kept.ok and kept.value == "1", kept
    finally:
        client.release_lease("daemon-lease")


def test_a_daemon_ends_when_its_worker_dies_first(client: PoolClient, tmp_path: Path, daemons: list[int]) -> None:
    # The worker is SIGKILLed before it can clean up: its orphans land on the pool, which kills them.
    pidfile = tmp_path / "orphan.pid"
    result = client.run_code(daemonise(pidfile, "import signal\nos.kill(os.getpid(), signal.SIGKILL)"))
    assert not result.ok and result.status == "died", result
    pid = read_pid(pidfile)
    daemons.append(pid)
    assert gone_within(pid, 2.0), f"daemon {pid} outlived its worker"


def test_nothing_a_job_started_survives_the_pools_sigterm(arb: ArbiterProc, tmp_path: Path, daemons: list[int]) -> None:
    pool = start_pool(arb, "sigterm.sock")
    try:
        pidfile = tmp_path / "running.pid"
        results: list[JobResult] = []
        job = threading.Thread(
            target=lambda: results.append(
                pool.client.run_code(daemonise(pidfile, "time.sleep(600)"), on_output=lambda s, t: None)
            )
        )
        job.start()
        pid = read_pid(pidfile)
        daemons.append(pid)
        workers = pool.worker_pids()
        assert pool.proc is not None
        pool.proc.terminate()
        assert pool.proc.wait(15) == 0, pool.log()
        job.join(10)
        assert results and results[0].status == "cancelled", results
        for worker in workers:
            assert gone_within(worker, 2.0), f"worker {worker} survived the pool"
        assert gone_within(pid, 2.0), f"daemon {pid} of a running job survived the pool's shutdown"
    finally:
        pool.stop()
