"""The Dispatcher in-process: real context workers (fake backend, no arbiter), no pool, no sockets.

Each test builds a Dispatcher with what it uses (a config, gates, an ``emit`` that records, a
spawn-args provider) and checks one rule of the queue, the leases or the one-result guarantee.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from krex_lab.workers.pool.clients import ClientWatch
from krex_lab.workers.pool.dispatcher import DispatchConfig, Dispatcher, Job
from krex_lab.workers.results import JobResult
from krex_lab.workers.wire import Init, Output, Run

TIMEOUT = 20.0


class OpenGates:
    """No arbiter: every gate open."""

    def is_open(self, gpu: int) -> bool:
        return True

    def holder_pid(self, gpu: int) -> int | None:
        return None


class Recorder:
    """The dispatcher's ``emit``: what each job sent its client, in order."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, Output | JobResult]] = []

    def __call__(self, job: Job, message: Output | JobResult) -> None:
        self.messages.append((job.id, message))

    def results(self, job: Job | None = None) -> list[tuple[str, JobResult]]:
        return [(j, m) for j, m in self.messages if isinstance(m, JobResult) and (job is None or j == job.id)]

    def output(self, job: Job) -> str:
        return "".join(m.text for j, m in self.messages if isinstance(m, Output) and j == job.id)


def spawn_args(wid: int, gpu: int) -> tuple[list[str], dict[str, str], Init]:
    env = {**os.environ, "KREX_GPU": str(gpu), "KREX_WORKER": "1", "KREX_WORKER_REAL": "0"}
    init = Init(gpu=gpu, parent=os.getpid(), name=f"test worker {wid}", preload=[], warmup=False, real=False)
    return [sys.executable, "-u", "-m", "krex_lab.workers.context"], env, init


async def until(predicate: Callable[[], object], timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {predicate}")
        await asyncio.sleep(0.01)


@asynccontextmanager
async def dispatcher(**config: object) -> AsyncIterator[tuple[Dispatcher, Recorder]]:
    options: dict[str, object] = {"workers_per_gpu": 1, "spares_per_gpu": 0, "interrupt_grace": 1.0, **config}
    emit = Recorder()
    d = Dispatcher(DispatchConfig(**options), OpenGates(), emit, spawn_args, gpus=[0])  # type: ignore[arg-type]
    d.rebalance()
    try:
        await until(d.ready)
        yield d, emit
    finally:
        d.closing = True
        workers = list(d.workers.values())
        for w in workers:
            w.kill("test over")
        await asyncio.gather(*(w.wait_dead(5.0) for w in workers))


_rids = iter(range(1, 1 << 30))


def job(d: Dispatcher, code: str, *, lease: str | None = None, client_pid: int | None = None) -> Job:
    j = Job(
        id=d.new_id(), rid=next(_rids), client_pid=client_pid, spec=Run(job="", kind="code", code=code), lease=lease
    )
    d.submit(j)
    return j


async def result_of(emit: Recorder, j: Job) -> JobResult:
    await until(lambda: emit.results(j))
    return emit.results(j)[0][1]


async def test_jobs_run_in_the_order_they_were_queued() -> None:
    async with dispatcher() as (d, emit):
        first = job(d, "import time; time.sleep(0.3)")
        queued = [job(d, f"{n}") for n in range(4)]
        assert [j.id for j in d.queue] == [j.id for j in queued]  # one worker: the rest wait, in order
        await until(lambda: len(emit.results()) == 5)
        assert [j for j, _ in emit.results()] == [first.id, *(j.id for j in queued)]
        assert [r.value for _, r in emit.results()[1:]] == ["0", "1", "2", "3"]


async def test_a_lease_keeps_its_worker_and_namespace() -> None:
    async with dispatcher() as (d, emit):
        a = await result_of(emit, job(d, "x = 41", lease="L"))
        plain = await result_of(emit, job(d, "1"))
        b = await result_of(emit, job(d, "x + 1", lease="L"))
        assert a.ok and b.ok and b.value == "42"
        assert a.worker_pid == b.worker_pid
        assert plain.worker_pid != a.worker_pid  # the leased worker serves its lease only
        assert d.leases["L"].worker is not None and d.leases["L"].worker.pid == a.worker_pid


async def test_an_expired_lease_releases_its_worker() -> None:
    async with dispatcher() as (d, emit):
        a = await result_of(emit, job(d, "x = 41", lease="L"))
        d.expire_leases(3600)
        assert "L" in d.leases  # not idle long enough
        d.leases["L"].last_used -= 10
        d.expire_leases(5)
        assert "L" not in d.leases
        assert not any(w.lease is not None for w in d.workers.values())
        again = await result_of(emit, job(d, "x", lease="L"))  # a new lease: a reset namespace
        assert not again.ok and again.status == "exception" and "NameError" in (again.error or "")
        assert a.worker_pid is not None


async def test_a_worker_killed_mid_job_gives_exactly_one_result() -> None:
    async with dispatcher() as (d, emit):
        j = job(d, "import time\nprint('started', flush=True)\ntime.sleep(30)")
        await until(lambda: "started" in emit.output(j))
        assert j.worker is not None and j.worker.pid is not None
        pid = j.worker.pid
        os.kill(pid, signal.SIGKILL)
        r = await result_of(emit, j)
        assert r.status == "died" and "SIGKILL" in (r.error or "") and r.worker_pid == pid
        after = await result_of(emit, job(d, "2"))  # a new worker takes the next job
        assert after.ok and after.worker_pid != pid
        await asyncio.sleep(0.3)
        assert len(emit.results(j)) == 1


async def test_a_queued_job_withdrawn_gets_one_cancelled_result() -> None:
    async with dispatcher() as (d, emit):
        running = job(d, "import time; time.sleep(0.5)")
        queued = job(d, "'never runs'")
        assert queued in d.queue
        d.interrupt(queued, force=False)
        d.interrupt(queued, force=True)  # a second interrupt changes nothing
        assert queued not in d.queue
        r = await result_of(emit, queued)
        assert r.status == "cancelled" and not r.ok and r.worker_pid is None
        assert (await result_of(emit, running)).ok
        assert len(emit.results(queued)) == 1


async def test_an_interrupted_running_job_gets_one_result() -> None:
    async with dispatcher() as (d, emit):
        j = job(d, "import time\nprint('started', flush=True)\ntime.sleep(30)")
        await until(lambda: "started" in emit.output(j))
        d.interrupt(j, force=False)
        r = await result_of(emit, j)
        assert r.status == "interrupted" and "KeyboardInterrupt" in (r.traceback or "")
        await asyncio.sleep(0.3)
        assert len(emit.results(j)) == 1


async def test_a_client_that_exits_takes_its_jobs_and_leases() -> None:
    client = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        async with dispatcher() as (d, emit):
            watch = ClientWatch(d.client_gone)
            watch.watch(client.pid)
            running = job(d, "import time\nprint('started', flush=True)\ntime.sleep(30)", client_pid=client.pid)
            queued = job(d, "1", client_pid=client.pid)
            other = job(d, "'still mine'")
            await until(lambda: "started" in emit.output(running))
            leased = job(d, "y = 1", lease="theirs", client_pid=client.pid)
            client.kill()
            r_running, r_queued = await result_of(emit, running), await result_of(emit, queued)
            assert r_running.status == "interrupted"
            assert r_queued.status == "cancelled"
            await until(lambda: "theirs" not in d.leases)
            assert (await result_of(emit, other)).ok  # another client's job is untouched
            assert len(emit.results(leased)) == 1
            watch.close()
    finally:
        client.kill()
        client.wait()


async def test_a_client_sizes_the_pool_per_gpu_while_it_lives() -> None:
    async with dispatcher(max_workers_per_gpu=3) as (d, _):
        assert d.size(4242, 5) == 3  # within max_workers_per_gpu
        await until(lambda: sum(1 for w in d._alive(0) if w.active and w.state == "idle") == 3)
        d.size(4343, 2)  # a smaller ask beside it changes nothing
        assert d.wanted_per_gpu() == 3
        d.client_gone(4242)  # its ask ends with it: the other's stands
        assert d.wanted_per_gpu() == 2
        await until(lambda: len(d._alive(0)) == 2)
        assert d.size(4343, 0) == 1  # asks nothing any more: back to workers_per_gpu
        await until(lambda: len(d._alive(0)) == 1)


def test_workers_start_as_many_at_once_as_the_node_has_cpus() -> None:
    from krex_lab.workers.pool.service import Pool, default_start_concurrency

    assert default_start_concurrency() == max(2, len(os.sched_getaffinity(0)))
    trait = Pool.class_traits()["start_concurrency"]
    assert "node's CPUs" in trait.help  # no Pool is built here: it would hold sockets past the test
