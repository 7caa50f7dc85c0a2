"""The shield: a region's reserved cores run its holder and nothing else, KREX session or not.

Real arbiters, real busy processes that never talk to KREX, real affinities; the cpuset
partition test runs where cgroup v2 offers the cpuset controller (the GPU machine), the IRQ
test on a stand-in ``/proc/irq`` tree (containers mount the real one read-only).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from krex_lab.arbiter.journal import Journal, undo_outstanding
from krex_lab.enforcement.shield import (
    CpusetPartition,
    IrqShield,
    Shield,
    cgroup_of,
    limits_on,
    node_pids,
    undo_partition,
)
from krex_lab.pytest_plugin import ArbiterProc, running_arbiter, wait_for
from tests.support.procs import Procs

CPUS = sorted(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(CPUS) < 2, reason="a shield needs a core to reserve and one to keep")


def _why_no_partition() -> str:
    """Why a partition cannot be tried here ("" when it can): the holder inherits this process's cgroup."""
    partition = CpusetPartition()
    if not partition.available:
        return f"no cpuset partitions here: {partition.reason}"
    assert partition.root is not None
    where = cgroup_of(os.getpid())
    limits = limits_on(partition.root, where) if where is not None else set()
    # The shield rightly refuses to lift them (e.g. a container's memory.max); nothing to test then.
    return f"this process's cgroup {where} sets limits a partition would lift: {sorted(limits)}" if limits else ""


BUSY = "import threading\ndef spin():\n    while True: pass\nthreading.Thread(target=spin, daemon=True).start()\nspin()"


def _affinities(pid: int) -> dict[int, set[int]]:
    """Every thread's allowed CPUs."""
    return {int(t): os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.fixture
def busy() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Two busy processes that are no KREX sessions: one free to run anywhere, one pinned to the
    core a region reserves first (the highest)."""

    def pin() -> None:
        os.sched_setaffinity(0, {CPUS[-1]})

    procs = [
        subprocess.Popen([sys.executable, "-c", BUSY]),
        subprocess.Popen([sys.executable, "-c", BUSY], preexec_fn=pin),
    ]
    wait_for(lambda: all(len(os.listdir(f"/proc/{p.pid}/task")) == 2 for p in procs))
    yield procs
    for p in procs:
        p.kill()
        p.wait()


@pytest.fixture
def affinity_arbiter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ArbiterProc]:
    yield from running_arbiter(tmp_path, monkeypatch, extra=("--Arbiter.shield=affinity",))


@pytest.fixture
def procs_on(affinity_arbiter: ArbiterProc) -> Iterator[Procs]:
    p = Procs(affinity_arbiter.env())
    yield p
    p.cleanup()


def _assert_shielded(busy: list[subprocess.Popen[bytes]], reserved: set[int]) -> None:
    for p in busy:
        for tid, cpus in _affinities(p.pid).items():
            assert not cpus & reserved, f"thread {tid} of busy process {p.pid} may run on reserved {reserved}: {cpus}"


@needs_two_cores
def test_busy_processes_that_are_no_sessions_leave_the_reserved_core_and_come_back(
    busy: list[subprocess.Popen[bytes]], procs_on: Procs
) -> None:
    before = [_affinities(p.pid) for p in busy]
    holder = procs_on.start("holder", "0", "--hold", "1.0", wait_line="granted")
    reserved = os.sched_getaffinity(holder.pid)
    assert reserved and reserved != set(CPUS)
    _assert_shielded(busy, reserved)
    # the pinned one had nothing but the reserved core: it runs on the others meanwhile
    assert all(cpus == set(CPUS) - reserved for cpus in _affinities(busy[1].pid).values())
    # this test process is no session either: what it starts now inherits the shield ...
    assert not os.sched_getaffinity(0) & reserved
    newborn = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    line = Procs.readline(holder)
    assert line.startswith("released"), line
    released = Procs.report(line)
    assert released["shield"]["mode"] == "affinity"
    assert {busy[0].pid, busy[1].pid} <= set(released["moved"])
    assert released["shield"]["kernel_threads_left"] >= 0
    holder.wait()
    # (after the shield's linger: see test_back_to_back_regions_adopt_the_lingering_shield)
    wait_for(lambda: [_affinities(p.pid) for p in busy] == before, timeout=5.0)
    # ... and gets what its parent got back, though no region ever recorded it
    try:
        wait_for(lambda: os.sched_getaffinity(newborn.pid) == os.sched_getaffinity(0) == set(CPUS), timeout=5.0)
    finally:
        newborn.kill()
        newborn.wait()


@needs_two_cores
def test_after_sigkill_of_the_arbiter_the_guardian_restores_every_affinity(
    busy: list[subprocess.Popen[bytes]], affinity_arbiter: ArbiterProc, procs_on: Procs
) -> None:
    before = [_affinities(p.pid) for p in busy]
    holder = procs_on.start("holder", "0", wait_line="granted")
    _assert_shielded(busy, os.sched_getaffinity(holder.pid))
    assert affinity_arbiter.proc is not None and affinity_arbiter.guardian_pid() is not None
    affinity_arbiter.proc.kill()
    took = wait_for(lambda: [_affinities(p.pid) for p in busy] == before, timeout=2.0)
    print(f"guardian restored both busy processes {took * 1e3:.0f} ms after SIGKILL")
    affinity_arbiter.proc.wait()


@contextlib.contextmanager
def _arbiter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> Iterator[tuple[ArbiterProc, Procs]]:
    """An arbiter of its own (``extra``: its options) and session processes on it; both ended after."""
    gen = running_arbiter(tmp_path, monkeypatch, extra=extra)
    arbiter = next(gen)
    procs = Procs(arbiter.env())
    try:
        yield arbiter, procs
    finally:
        procs.cleanup()
        for _ in gen:
            pass


SPAWNER = """
import os, subprocess, sys, threading, time, krex_lab
krex_lab.attach(gpu=0)
stop = threading.Event()
with krex_lab.exclusive(gpu=0) as region:
    pool = threading.Thread(target=stop.wait)
    pool.start()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print(pool.native_id, child.pid, sorted(region.report["cores"]), flush=True)
    sys.stdin.readline()  # the test looks at them inside the region first
print("released", flush=True)
sys.stdin.readline()
stop.set()
child.kill()
"""


@needs_two_cores
@pytest.mark.parametrize("linger", ["0", "0.05"])
def test_threads_and_processes_the_holder_starts_in_a_region_are_not_left_pinned(
    linger: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread pool made by the first operation timed would otherwise run on one core for good."""
    with _lingering(tmp_path, monkeypatch, float(linger)) as (_, procs):
        holder = _script(procs, SPAWNER)
        assert holder.stdout is not None and holder.stdin is not None
        tid, child, cores = holder.stdout.readline().split(" ", 2)
        assert os.sched_getaffinity(int(tid)) == os.sched_getaffinity(int(child)) == set(json.loads(cores))
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().startswith("released")
        wait_for(lambda: all(os.sched_getaffinity(p) == set(CPUS) for p in (int(tid), int(child), holder.pid)))
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(10)


def _script(procs: Procs, source: str) -> subprocess.Popen[str]:
    """``python -c source`` on ``procs``'s arbiter, talked to over stdin and stdout; killed with them."""
    proc = subprocess.Popen(
        [sys.executable, "-c", source], env=procs.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    procs.procs.append(proc)
    assert proc.stdout is not None and proc.stdin is not None
    return proc


def _lingering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seconds: float
) -> contextlib.AbstractContextManager[tuple[ArbiterProc, Procs]]:
    return _arbiter(tmp_path, monkeypatch, "--Arbiter.shield=affinity", f"--Arbiter.shield_linger={seconds}")


@needs_two_cores
def test_back_to_back_regions_adopt_the_lingering_shield_and_its_end_restores_everyone(
    busy: list[subprocess.Popen[bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _lingering(tmp_path, monkeypatch, 1.5) as (arbiter, procs):
        assert arbiter.status()["arbiter"]["shield_linger_s"] == 1.5
        before = [_affinities(p.pid) for p in busy]
        holder = procs.start("holder", "0", "--hold", "0.1", "--regions", "3", "--linger", wait_line="granted")
        first = Procs.report(Procs.readline(holder))
        assert first["shield"]["adopted"] == "" and first["shield"]["lingers"], first["shield"]
        lines = [Procs.report(Procs.readline(holder)) for _ in range(4)]  # granted, released, twice
        granted, last = lines[0::2], lines[-1]
        assert granted[0]["shield"]["adopted"] == first["shield"]["lingers"], "the second region took over the shield"
        assert granted[1]["shield"]["adopted"] == lines[1]["shield"]["lingers"]
        reserved = set(last["cores"])
        assert last["shield"]["lingers"] and not last["degraded"]
        # Lingering: everyone, the last holder too, stays off the core for a while ...
        _assert_shielded(busy, reserved)
        assert not os.sched_getaffinity(holder.pid) & reserved
        # ... then gets their exact affinity back.
        took = wait_for(lambda: [_affinities(p.pid) for p in busy] == before, timeout=10.0)
        assert took > 0.5, f"restored after {took:.3f} s: the shield did not linger"
        assert os.sched_getaffinity(holder.pid) == set(CPUS)


@needs_two_cores
def test_a_chain_of_adopted_shields_walks_the_node_afresh_after_a_second(
    busy: list[subprocess.Popen[bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pids are reused: a chain trusts its first node walk for FRESH_WALK (1 s) only."""
    with _lingering(tmp_path, monkeypatch, 1.0) as (_, procs):
        holder = procs.start("holder", "0", "--hold", "0.25", "--regions", "7", wait_line="granted")
        granted = []
        for _ in range(6):
            assert Procs.readline(holder).startswith("released")
            granted.append(Procs.report(Procs.readline(holder)))
            _assert_shielded(busy, set(granted[-1]["cores"]))
        adopted = [bool(g["shield"]["adopted"]) for g in granted]
        assert any(adopted), "no region adopted the shield of the one before"
        assert not all(adopted), "seven regions of 0.25 s and not one walked the node afresh"


CHAIN = """
import json, sys, threading, time, krex_lab
krex_lab.attach(gpu=0)
stop = threading.Event()
pool = None
for i in range(3):
    with krex_lab.exclusive(gpu=0) as region:
        time.sleep(0.05)
    print(json.dumps(region.report["shield"]), flush=True)
    if i == 0:  # between two regions of a chain: it inherits what the lingering shield left it
        pool = threading.Thread(target=stop.wait)
        pool.start()
print(pool.native_id, flush=True)
sys.stdin.readline()
stop.set()
"""


@needs_two_cores
def test_a_thread_started_between_adopted_regions_gets_all_its_cores_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _lingering(tmp_path, monkeypatch, 1.0) as (_, procs):
        holder = _script(procs, CHAIN)
        assert holder.stdout is not None and holder.stdin is not None
        shields = [json.loads(holder.stdout.readline()) for _ in range(3)]
        assert shields[1]["adopted"], shields  # the thread was first seen by an adopting region
        tid = int(holder.stdout.readline())
        wait_for(lambda: os.sched_getaffinity(tid) == os.sched_getaffinity(holder.pid) == set(CPUS), timeout=5.0)
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(10)


@needs_two_cores
def test_sigkill_of_the_arbiter_while_a_shield_lingers_restores_every_affinity(
    busy: list[subprocess.Popen[bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _lingering(tmp_path, monkeypatch, 60.0) as (arbiter, procs):
        before = [_affinities(p.pid) for p in busy]
        holder = procs.start("holder", "0", "--hold", "0.1", "--linger", wait_line="granted")
        released = Procs.report(Procs.readline(holder))
        assert released["shield"]["lingers"]
        _assert_shielded(busy, set(released["cores"]))
        assert arbiter.proc is not None and arbiter.guardian_pid() is not None
        arbiter.proc.kill()
        wait_for(lambda: [_affinities(p.pid) for p in busy] == before, timeout=3.0)
        wait_for(lambda: os.sched_getaffinity(holder.pid) == set(CPUS), timeout=3.0)
        arbiter.proc.wait()


def test_sessions_mode_leaves_processes_that_are_no_sessions_alone(
    busy: list[subprocess.Popen[bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _arbiter(tmp_path, monkeypatch, "--Arbiter.shield=sessions") as (_, procs):
        before = [_affinities(p.pid) for p in busy]
        holder = procs.start("holder", "0", "--hold", "0.5", wait_line="granted")
        assert [_affinities(p.pid) for p in busy] == before
        assert Procs.report(Procs.readline(holder))["shield"]["mode"] == "sessions"


def test_status_says_whether_neighbours_are_guarded_and_why_auto_chose_its_shield(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without both in ``krex status`` (and the arbiter's log), a run where the guard's tests fail
    cannot tell a guard that is off from one that acts, nor why ``auto`` chose as it did."""
    why = CpusetPartition().reason
    chosen = "affinity" if why else "cpuset"
    assert Shield("auto").describe() == f"{chosen} (auto: {why or 'cpuset partitions available'})"
    monkeypatch.delenv("KREX_GUARD_NEIGHBOURS", raising=False)  # a run of the suite with the guard set
    for guard, extra in (
        (True, ("--guard-neighbours", "--Arbiter.shield=auto")),
        (False, ("--Arbiter.guard_neighbours=False", "--Arbiter.shield=sessions")),
    ):
        runs = tmp_path / str(guard)
        runs.mkdir()
        arb = next(running_arbiter(runs, monkeypatch, extra=extra))
        try:
            row = arb.status()["arbiter"]
            assert row["guard_neighbours"] is guard, row
            assert row["shield"] == (Shield("auto").describe() if guard else "sessions"), row
            assert f"neighbour guard {'on' if guard else 'off'}; shield {row['shield']}" in arb.output()
        finally:
            arb.stop()


def test_node_pids_lists_user_processes_and_counts_kernel_threads(busy: list[subprocess.Popen[bytes]]) -> None:
    pids, kernel, foreign = node_pids({busy[1].pid})
    assert busy[0].pid in pids and busy[1].pid not in pids and os.getpid() in pids
    assert foreign == 0
    assert 2 not in pids  # kthreadd
    if os.path.exists("/proc/2/stat"):
        assert kernel >= 1
    mine, _, foreign = node_pids(set(), uid=os.getuid() + 12345)
    assert mine == [] or all(psutil.Process(p).uids().real == os.getuid() + 12345 for p in mine)
    assert foreign >= len(pids)


def test_irq_affinities_narrowed_journaled_and_restored(tmp_path: Path) -> None:
    root = tmp_path / "irq"
    root.mkdir()
    (root / "default_smp_affinity").write_text("ff\n")
    originals = {"24": "0-3", "25": "3", "26": "0-1", "27": "2-3"}
    for irq, cpus in originals.items():
        (root / irq).mkdir()
        (root / irq / "smp_affinity_list").write_text(cpus + "\n")
    journal = Journal(tmp_path / "journal.jsonl")
    irqs = IrqShield(root)
    moved, note = irqs.take("r1", {3}, {0, 1, 2, 3}, journal.record)
    assert (moved, note) == (3, "")
    now = {irq: (root / irq / "smp_affinity_list").read_text().strip() for irq in originals}
    assert now == {"24": "0,1,2", "25": "0,1,2", "26": "0-1", "27": "2"}
    assert irqs.give_back("r1") == 3
    assert {irq: (root / irq / "smp_affinity_list").read_text().strip() for irq in originals} == {
        "24": "0-3",
        "25": "3",
        "26": "0-1",
        "27": "2-3",
    }


def test_a_crafted_partition_path_is_never_touched(tmp_path: Path) -> None:
    victim = tmp_path / "krex-shield-x"
    victim.mkdir()
    errors = undo_partition(victim, [[os.getpid(), 1, "/"]], root=tmp_path / "elsewhere")
    assert errors and "not a KREX shield partition" in errors[0]
    assert victim.is_dir()


@pytest.mark.skipif(bool(_why_no_partition()), reason=_why_no_partition())
@needs_two_cores
def test_cpuset_partition_takes_the_core_from_every_cgroup_and_the_journal_gives_it_back(
    busy: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        before = [_affinities(p.pid) for p in busy]
        shield = Shield("cpuset")
        assert shield.mode == "cpuset"
        journal = Journal(tmp_path / "journal.jsonl")
        result = shield.take("rt1", {CPUS[-1]}, [holder.pid], journal.record)
        assert result.mode == "cpuset", result.notes
        assert os.sched_getaffinity(holder.pid) == {CPUS[-1]}
        _assert_shielded(busy, {CPUS[-1]})
        # the arbiter dies here: the journal alone undoes the partition
        summary = undo_outstanding(tmp_path / "journal.jsonl")
        assert summary.unshielded >= 1 and not summary.errors, summary
        assert not Path(result.partition).exists()
        wait_for(lambda: [_affinities(p.pid) for p in busy] == before, timeout=2.0)
        assert os.sched_getaffinity(holder.pid) == set(CPUS)
    finally:
        holder.kill()
        holder.wait()
