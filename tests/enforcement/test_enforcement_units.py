"""The enforcement steps on their own: journal replay, exact affinity restore, freezing trees."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from krex_lab.arbiter.journal import Journal, Stop, read_outstanding, undo_outstanding
from krex_lab.enforcement.corelock import NodeCoreLock
from krex_lab.enforcement.freeze import Freezer
from krex_lab.enforcement.isolate import CoreBook
from krex_lab.procutil import proc_state, start_time, tree
from krex_lab.pytest_plugin import cpu_gain, wait_for

needs_two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")


@pytest.fixture
def spinner() -> Iterator[subprocess.Popen[bytes]]:
    code = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'while True: pass']); \nwhile True: pass"
    proc = subprocess.Popen([sys.executable, "-c", code])
    wait_for(lambda: len(tree(proc.pid)) == 2)
    yield proc
    for pid in tree(proc.pid)[::-1]:
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGKILL)
    proc.wait()


def test_freezer_journals_before_it_stops_and_replay_thaws(tmp_path: Path, spinner: subprocess.Popen[bytes]) -> None:
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    seen_before_stop: list[list[str | None]] = []

    def record(kind: str, region: str, **data: object) -> None:
        # Every pid named in the entry must still be running when it is written.
        seen_before_stop.append([proc_state(p) for p, _ in data["procs"]])  # type: ignore[attr-defined]
        journal.record(kind, region, **data)

    freezer = Freezer(record)
    result = freezer.freeze("r1", [spinner.pid], exempt=set())
    assert sorted(result.pids) == sorted(tree(spinner.pid))
    assert all(s != "T" for states in seen_before_stop for s in states), "journaled before the stop"
    wait_for(lambda: not freezer.pending(result), timeout=2.0)
    assert cpu_gain(spinner.pid) == pytest.approx(0.0, abs=0.02)
    outstanding = read_outstanding(path)
    assert outstanding and isinstance(outstanding[0], Stop)
    summary = undo_outstanding(path)
    assert summary.thawed == 2
    assert cpu_gain(spinner.pid) > 0.05
    assert read_outstanding(path) == []


def test_ended_region_is_not_replayed(tmp_path: Path, spinner: subprocess.Popen[bytes]) -> None:
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    journal.record("stop", "r1", procs=[[spinner.pid, start_time(spinner.pid)]])
    journal.end("r1")
    assert read_outstanding(path) == []
    assert path.stat().st_size == 0, "an empty journal is truncated"


def test_replay_ignores_reused_pids(tmp_path: Path, spinner: subprocess.Popen[bytes]) -> None:
    os.kill(spinner.pid, signal.SIGSTOP)
    wait_for(lambda: proc_state(spinner.pid) == "T")
    path = tmp_path / "journal.jsonl"
    Journal(path).record("stop", "r1", procs=[[spinner.pid, (start_time(spinner.pid) or 0) + 1]])
    assert undo_outstanding(path).thawed == 0
    assert proc_state(spinner.pid) == "T", "a different start time means another process: not touched"
    os.kill(spinner.pid, signal.SIGCONT)


@needs_two_cores
def test_core_book_restores_exactly_across_overlapping_regions(spinner: subprocess.Popen[bytes]) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    book = CoreBook(cpus)
    child = tree(spinner.pid)[1]
    original = os.sched_getaffinity(spinner.pid)
    os.sched_setaffinity(child, {cpus[0], cpus[-1]})
    child_original = os.sched_getaffinity(child)
    journaled: list[list[object]] = []
    a = book.isolate("rA", [child], [spinner.pid], 1, journaled.extend)
    assert a.cores and 0 not in a.cores
    assert os.sched_getaffinity(child) == set(a.cores)
    assert not os.sched_getaffinity(spinner.pid) & set(a.cores)
    if len(cpus) >= 3:
        b = book.isolate("rB", [spinner.pid], [child], 1, journaled.extend)
        assert not set(b.cores) & set(a.cores), "two regions never share a reserved core"
        book.release("rA")
        assert os.sched_getaffinity(spinner.pid) == set(b.cores)
        book.release("rB")
    else:
        assert book.pick(1) == [], "the last free core is never reserved"
        book.release("rA")
    assert os.sched_getaffinity(spinner.pid) == original
    assert os.sched_getaffinity(child) == child_original
    tids = {int(t[0]) for t in journaled}  # type: ignore[call-overload]
    assert {spinner.pid, child} <= tids, "originals are journaled"


def test_core_book_never_picks_core_zero_while_others_exist() -> None:
    assert 0 not in CoreBook([0, 1, 2, 3]).pick(2)
    assert CoreBook([0, 1, 2, 3]).pick(8) == [1, 2, 3], "core 0 is left for the others"
    assert CoreBook([0]).pick(1) == []


@pytest.fixture
def threaded() -> Iterator[subprocess.Popen[bytes]]:
    """A process with five sleeping threads besides its main one."""
    code = (
        "import threading, time\n"
        "for _ in range(5): threading.Thread(target=time.sleep, args=(60,)).start()\n"
        "time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    wait_for(lambda: len(os.listdir(f"/proc/{proc.pid}/task")) == 6)
    yield proc
    proc.kill()
    proc.wait()


def _tids(pid: int) -> list[int]:
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))


@needs_two_cores
def test_core_book_journals_each_thread_under_its_process_and_restores_every_one(
    threaded: subprocess.Popen[bytes],
) -> None:
    book = CoreBook(sorted(os.sched_getaffinity(0)))
    originals = {tid: os.sched_getaffinity(tid) for tid in _tids(threaded.pid)}
    journaled: list[list[object]] = []
    result = book.isolate("r1", [os.getpid()], [threaded.pid], 1, journaled.extend)
    try:
        assert result.cores
        for tid in originals:
            assert not os.sched_getaffinity(tid) & set(result.cores), f"thread {tid} left on a reserved core"
        start = start_time(threaded.pid)
        mine = [r for r in journaled if r[1] == threaded.pid]
        assert sorted(r[0] for r in mine) == sorted(originals)  # type: ignore[type-var]
        assert all(r[2] == start for r in mine), "every thread is named by its process's start time"
    finally:
        book.release("r1")
    assert {tid: os.sched_getaffinity(tid) for tid in originals} == originals


@needs_two_cores
def test_replay_restores_a_process_threads_and_nothing_it_cannot_name(
    tmp_path: Path, threaded: subprocess.Popen[bytes], spinner: subprocess.Popen[bytes]
) -> None:
    """A ``threads`` record restores a thread only where its process has the recorded start time
    and still lists that thread: a record naming another process's thread under this pid (what a
    reused tid would look like) and one with another start time change nothing."""
    cpus = sorted(os.sched_getaffinity(0))
    tids, start = _tids(threaded.pid), start_time(threaded.pid)
    stranger = spinner.pid  # a live thread, but not one of threaded's
    for tid in [*tids, stranger]:
        os.sched_setaffinity(tid, {cpus[0]})
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    journal.record("threads", "r1", threads=[[tid, threaded.pid, start, cpus] for tid in tids[1:]])
    journal.record("threads", "r2", threads=[[stranger, threaded.pid, start, cpus]])
    journal.record("threads", "r3", threads=[[tids[0], threaded.pid, (start or 0) + 1, cpus]])
    journal.close()
    summary = undo_outstanding(path)
    assert summary.restored == len(tids) - 1, summary
    assert all(os.sched_getaffinity(tid) == set(cpus) for tid in tids[1:])
    assert os.sched_getaffinity(stranger) == {cpus[0]}, "another process's thread was touched"
    assert os.sched_getaffinity(tids[0]) == {cpus[0]}, "a thread of a process with another start time was touched"


def test_core_book_lingers_and_the_next_region_asking_as_many_cores_adopts(
    spinner: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("a core to reserve and one to keep")
    book = CoreBook(cpus, node_lock=NodeCoreLock(tmp_path / "cores.lock"))
    original = os.sched_getaffinity(spinner.pid)
    # Asked for more cores than can be given (one is always kept): what counts is what was asked.
    cores = book.reserve("rA", len(cpus))
    a = book.isolate("rA", [os.getpid()], [spinner.pid], len(cpus), lambda threads: None)
    assert set(a.cores) == set(cores) and len(cores) < len(cpus)
    kept = book.linger("rA", "rA-shield")
    assert spinner.pid in {t[0] for t in kept}, "what the linger must restore is returned for its journal"
    assert not os.sched_getaffinity(spinner.pid) & set(cores), "the others stay off the cores"
    assert not os.sched_getaffinity(os.getpid()) & set(cores), "the holder is one of the others now"
    assert book.adopt("rA-shield", "rB", 1) == [], "a region asking another number walks afresh"
    assert book.adopt("rA-shield", "rB", len(cpus)) == cores
    book.isolate("rB", [os.getpid()], [], len(cpus), lambda threads: None)
    assert os.sched_getaffinity(os.getpid()) == set(cores)
    book.release("rB")
    assert os.sched_getaffinity(spinner.pid) == original
    assert os.sched_getaffinity(os.getpid()) == set(cpus)
