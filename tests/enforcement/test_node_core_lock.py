"""Two arbiters on one node never leave a process pinned.

Seen on the CI machine: after a run in which several arbiters shielded at once (a Ray cluster
simulated on one machine), PID 1 and everything it started afterwards were allowed core 0 only.
Each arbiter's core book restored what *it* had recorded as original -- the other's narrowed mask.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from krex_lab.enforcement.corelock import NodeCoreLock, default_path
from krex_lab.pytest_plugin import ArbiterProc, wait_for
from tests.support.procs import Procs

CPUS = set(os.sched_getaffinity(0))
BUSY = "while True: pass"


def _mask(pid: int) -> set[int]:
    return set(os.sched_getaffinity(pid))


@pytest.fixture
def two_arbiters(tmp_path: Path) -> Iterator[tuple[ArbiterProc, ArbiterProc]]:
    lock = f"--Arbiter.core_lock={tmp_path / 'cores.lock'}"
    arbs = []
    for name in ("x", "y"):
        runtime = tmp_path / name
        runtime.mkdir(mode=0o700)
        arbs.append(ArbiterProc(runtime, extra=("--Arbiter.shield=affinity", lock)).start())
    yield arbs[0], arbs[1]
    for arb in arbs:
        arb.stop()


@pytest.mark.skipif(len(CPUS) < 2, reason="a region needs a core to reserve and one to keep")
def test_overlapping_regions_of_two_arbiters_restore_every_affinity(
    two_arbiters: tuple[ArbiterProc, ArbiterProc],
) -> None:
    x, y = two_arbiters
    px, py = Procs(x.env()), Procs(y.env())
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        hx = px.start("holder", "0", "--hold", "2", "--linger", wait_line=None)
        hy = py.start("holder", "0", "--hold", "4", "--linger", wait_line=None)
        # Both holders started before either region: their originals are the full mask.
        wait_for(lambda: _mask(hx.pid) == CPUS and _mask(hy.pid) == CPUS)
        original = {p: _mask(p) for p in (hx.pid, hy.pid, busy.pid)}

        reports = {hx.pid: Procs.report(Procs.readline(hx)), hy.pid: Procs.report(Procs.readline(hy))}
        # Whichever arbiter granted first holds the node's cores; the other's region takes none.
        first, second = sorted((hx, hy), key=lambda h: not reports[h.pid]["cores"])
        arbiter_of_first = x if first is hx else y
        got, left = reports[first.pid], reports[second.pid]
        assert got["cores"] and not got["degraded"], got["failures"]
        assert left["cores"] == [] and left["degraded"], "the second arbiter's region takes no cores"
        assert arbiter_of_first.proc is not None
        assert any("another KREX arbiter" in f and f"pid {arbiter_of_first.proc.pid}" in f for f in left["failures"]), (
            left
        )
        assert _mask(first.pid) == set(got["cores"]), "the second arbiter left the first holder on its cores"

        # Both end, in either order (x's region ends first: the order that leaked when x held the cores).
        assert Procs.readline(hx, timeout=10).startswith("released")
        assert Procs.readline(hy, timeout=10).startswith("released")
        for pid, mask in original.items():
            wait_for(lambda pid=pid, mask=mask: _mask(pid) == mask, timeout=5)  # type: ignore[misc]
        assert _mask(os.getpid()) == CPUS, "the test process (no session) got its cores back"
    finally:
        busy.kill()
        busy.wait()
        px.cleanup()
        py.cleanup()


def test_the_lock_names_its_holder_and_is_dropped_when_it_dies(tmp_path: Path) -> None:
    path = tmp_path / "cores.lock"
    code = (
        "import sys, time; from pathlib import Path; from krex_lab.enforcement.corelock import NodeCoreLock\n"
        f"assert NodeCoreLock(Path({str(path)!r})).acquire() == ''\nprint('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        mine = NodeCoreLock(path)
        why = mine.acquire()
        assert f"pid {holder.pid}" in why and not mine.held
    finally:
        holder.kill()
        holder.wait()
    assert mine.acquire() == "" and mine.held, "a dead holder's lock is free"
    mine.release()
    assert not mine.held and path.read_text() == ""


def test_a_symlinked_or_foreign_lock_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("keep")
    link = tmp_path / "cores.lock"
    link.symlink_to(target)
    why = NodeCoreLock(link).acquire()
    assert "symlink" in why and target.read_text() == "keep"

    fifo = tmp_path / "fifo.lock"
    os.mkfifo(fifo)
    assert "not this user's file" in NodeCoreLock(fifo).acquire()


def test_the_default_lock_is_in_a_directory_only_its_user_can_write() -> None:
    path = default_path()
    st = os.stat(path.parent)
    if os.geteuid() == 0:
        assert path == Path("/run/krex-cores.lock")
    else:
        assert st.st_uid == os.geteuid() or path.name == f"krex-cores-{os.geteuid()}.lock"


@pytest.mark.skipif(len(CPUS) < 2, reason="a region needs a core to reserve and one to keep")
def test_a_dead_arbiters_lock_is_held_until_its_guardian_has_undone_the_region(tmp_path: Path) -> None:
    lock = tmp_path / "cores.lock"
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    arb = ArbiterProc(runtime, extra=("--Arbiter.shield=affinity", f"--Arbiter.core_lock={lock}")).start()
    assert arb.proc is not None
    procs = Procs(arb.env())
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    probe = NodeCoreLock(lock)
    guardian = None
    try:
        wait_for(lambda: _mask(busy.pid) == CPUS)
        holder = procs.start("holder", "0", wait_line=None)
        granted = Procs.report(Procs.readline(holder))
        assert granted["cores"] and not _mask(busy.pid) & set(granted["cores"]), granted
        guardian = next(
            p for p in psutil.Process(arb.proc.pid).children() if "krex_lab.arbiter.guardian" in " ".join(p.cmdline())
        )
        guardian.suspend()  # the undo cannot start: the window in which another arbiter must not take cores
        arb.proc.kill()
        arb.proc.wait()
        assert "another KREX arbiter" in probe.acquire(), "the dead arbiter's lock is still held"
        assert not _mask(busy.pid) & set(granted["cores"]), "nothing undone yet"
        guardian.resume()
        wait_for(lambda: probe.acquire() == "", timeout=10)
        assert _mask(busy.pid) == CPUS, "the guardian restored before it let the lock go"
    finally:  # processes first: a busy loop left behind skews everything measured after it
        busy.kill()
        busy.wait()
        procs.cleanup()
        if guardian is not None and guardian.is_running():
            guardian.resume()
        arb.stop()
        probe.close()
