"""Freezing through cgroup v2 (`krex arbiter --cgroups auto`): the kernel catches every fork."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from krex_lab.enforcement.cgroups import CgroupPlacer, cgroup_of, is_frozen
from krex_lab.procutil import proc_state, tree
from krex_lab.pytest_plugin import ArbiterProc, cpu_gain, running_arbiter, wait_for
from tests.support.procs import Procs, session_processes

if not CgroupPlacer(True).enabled:
    pytest.skip(f"cgroup v2 not manageable here: {CgroupPlacer(True).reason}", allow_module_level=True)


@pytest.fixture
def cg_arbiter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ArbiterProc]:
    yield from running_arbiter(tmp_path, monkeypatch, extra=("--cgroups", "auto"))


@pytest.fixture
def cg_procs(cg_arbiter: ArbiterProc) -> Iterator[Procs]:
    yield from session_processes(cg_arbiter)


def _session(arb: ArbiterProc, pid: int) -> dict:
    return next(s for g in arb.status()["gpus"] for s in g["sessions"] if s["pid"] == pid)


def test_forking_session_frozen_by_its_cgroup(cg_arbiter: ArbiterProc, cg_procs: Procs) -> None:
    forker = cg_procs.start("sibling", "0", "--forker")
    path = _session(cg_arbiter, forker.pid)["cgroup"]
    assert path and cgroup_of(forker.pid) == "/" + str(Path(path).relative_to(Path(path).parents[1]))
    assert cg_arbiter.status()["arbiter"]["cgroups"] == f"sessions placed under {Path(path).parent}"
    wait_for(lambda: len(tree(forker.pid)) > 3)
    holder = cg_procs.start("holder", "0", "--hold", "1.0", wait_line="granted")
    assert is_frozen(path)
    assert cpu_gain(forker.pid) == pytest.approx(0.0, abs=0.02), "no process of the tree runs"
    before = set(tree(forker.pid))
    assert set(tree(forker.pid)) == before, "no fork while frozen"
    assert proc_state(forker.pid) != "T", "frozen by its cgroup, not by SIGSTOP"
    released = cg_procs.report(cg_procs.readline(holder))
    assert path in released["frozen_cgroups"] and forker.pid in released["frozen"]
    assert not released["degraded"]
    wait_for(lambda: not is_frozen(path))
    wait_for(lambda: bool(set(tree(forker.pid)) - before), timeout=2.0)  # forking again


def test_children_from_before_placement_get_sigstop(cg_arbiter: ArbiterProc, cg_procs: Procs) -> None:
    # The child exists before the session registers, so it stays outside the session's cgroup.
    code = (
        "import subprocess, sys, time, krex_lab\n"
        "subprocess.Popen([sys.executable, '-c', 'while True: pass'])\ntime.sleep(0.3)\n"
        "krex_lab.attach(gpu=0)\nprint('ready', flush=True)\nwhile True: pass\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], env=cg_arbiter.env(), stdout=subprocess.PIPE, text=True)
    cg_procs.procs.append(parent)
    assert parent.stdout is not None and parent.stdout.readline().startswith("ready")
    child = tree(parent.pid)[1]
    assert cgroup_of(child) != cgroup_of(parent.pid)
    cg_procs.start("holder", "0", wait_line="granted")
    wait_for(lambda: proc_state(child) == "T", timeout=2.0)
    assert cpu_gain(parent.pid) == pytest.approx(0.0, abs=0.02)


def test_guardian_thaws_cgroups_when_the_arbiter_dies(cg_arbiter: ArbiterProc, cg_procs: Procs) -> None:
    sib = cg_procs.start("sibling", "0")
    path = _session(cg_arbiter, sib.pid)["cgroup"]
    cg_procs.start("holder", "0", wait_line="granted")
    assert is_frozen(path)
    assert cg_arbiter.proc is not None
    cg_arbiter.proc.kill()
    took = wait_for(lambda: not is_frozen(path), timeout=1.0)
    assert took < 1.0 and cpu_gain(sib.pid) > 0.02
    cg_arbiter.proc.wait()


def _cgroup_fds(pid: int, path: str) -> list[str]:
    """The arbiter's descriptors open on files of the cgroup at ``path``."""
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = str(fd.readlink())
        except OSError:
            continue
        if target.startswith(path + "/"):
            found.append(target)
    return found


def test_a_regions_cgroup_files_are_kept_until_the_session_ends(cg_arbiter: ArbiterProc, cg_procs: Procs) -> None:
    sib = cg_procs.start("sibling", "0")
    path = _session(cg_arbiter, sib.pid)["cgroup"]
    assert cg_arbiter.proc is not None
    for _ in range(2):  # the second region reuses what the first opened
        holder = cg_procs.start("holder", "0", "--hold", "0.1", wait_line="granted")
        released = cg_procs.report(cg_procs.readline(holder))
        assert path in released["frozen_cgroups"] and sib.pid in released["frozen"]
        wait_for(lambda: not is_frozen(path))
        kept = sorted(Path(t).name for t in _cgroup_fds(cg_arbiter.proc.pid, path))
        assert kept == ["cgroup.events", "cgroup.freeze", "cgroup.procs"], kept
    sib.kill()
    sib.wait()
    wait_for(lambda: not Path(path).exists(), timeout=5)  # the session ended: its cgroup goes
    assert _cgroup_fds(cg_arbiter.proc.pid, path) == [], "and with it the arbiter's descriptors"


def test_kept_cgroup_files_refuse_a_cgroup_krex_does_not_manage() -> None:
    from krex_lab.enforcement.cgroups import v2_root
    from krex_lab.enforcement.freeze import FREEZE_FILES
    from krex_lab.paths import UnsafePath

    root = v2_root()
    assert root is not None
    other = root / "not-krex-test"
    other.mkdir(exist_ok=True)
    try:
        for path in (str(other), str(root / "krex" / ".." / "not-krex-test")):
            with pytest.raises(UnsafePath):
                FREEZE_FILES.set(path, True)
            assert not is_frozen(other)
    finally:
        other.rmdir()


def test_a_process_with_sessions_on_two_gpus_is_frozen_by_a_region_on_the_first(
    cg_arbiter: ArbiterProc, cg_procs: Procs
) -> None:
    # Each registration moves the process into its new session's cgroup: it sits in its GPU 1
    # session's, so a region on GPU 0 that freezes the GPU 0 session's (empty) cgroup must still
    # stop it. (Taking the root as frozen with its session's cgroup let it run through regions.)
    code = (
        "import krex_lab.client\n"
        "a = krex_lab.client.Session(gpu=0, control=False)\n"
        "b = krex_lab.client.Session(gpu=1, control=False)\n"
        "print('ready', flush=True)\nwhile True: pass\n"
    )
    twice = subprocess.Popen([sys.executable, "-c", code], env=cg_arbiter.env(), stdout=subprocess.PIPE, text=True)
    try:
        assert Procs.readline(twice).startswith("ready")
        paths = {
            s["gpu"]: s["cgroup"] for g in cg_arbiter.status()["gpus"] for s in g["sessions"] if s["pid"] == twice.pid
        }
        assert cgroup_of(twice.pid) == "/" + str(Path(paths[1]).relative_to(Path(paths[1]).parents[1]))
        holder = cg_procs.start("holder", "0", "--hold", "1.0", wait_line="granted")
        assert cpu_gain(twice.pid) == pytest.approx(0.0, abs=0.02), "it runs through the region"
        released = cg_procs.report(cg_procs.readline(holder))
        assert twice.pid in released["frozen"] and released["failures"] == []
        wait_for(lambda: cpu_gain(twice.pid) > 0.05)
    finally:
        twice.kill()
        twice.wait()


def test_a_process_in_a_cgroup_frozen_for_gpu1_costs_a_gpu0_region_no_drain_timeout(
    cg_arbiter: ArbiterProc, cg_procs: Procs
) -> None:
    # It sits in its GPU 1 session's cgroup; GPU 1's region freezes it (by SIGSTOP or with that
    # cgroup, as the placement goes): its GPU 0 session can neither answer GPU 0's drain nor
    # submit work. Regions ask for no core (two at once on 2 cores would find none).
    both = cg_procs.start("sibling", "0", "--sleep", "--also-gpu", "1")
    gpu1 = next(
        s["cgroup"] for g in cg_arbiter.status()["gpus"] for s in g["sessions"] if (s["pid"], s["gpu"]) == (both.pid, 1)
    )
    cg_procs.start("holder", "1", "--cores", "0", wait_line="granted")
    wait_for(lambda: is_frozen(gpu1) or proc_state(both.pid) == "T")
    holder = cg_procs.start("holder", "0", "--cores", "0", "--hold", "0.2", wait_line=None)
    line = cg_procs.readline(holder)
    assert line.startswith("granted"), line
    g0 = cg_procs.report(line)
    assert g0["not_drained"] == {} and g0["degraded"] is False, g0
    assert both.pid in g0["skipped_stopped"] and g0["drain_s"] < 0.5, g0
