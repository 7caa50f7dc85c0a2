"""--cgroups auto never moves a process out of a cgroup whose limits would then stop applying.

This machine's cgroup v2 hierarchy may have no controllers (the hybrid layout), so no real limit
can be set: the reader and the placer are tested on a directory laid out as the kernel lays out
cgroupfs (on a real hierarchy the move itself is tested in test_cgroups.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from krex_lab.enforcement.cgroups import CgroupPlacer, limits_on


def _cgroup(root: Path, rel: str, **files: str) -> None:
    path = root / rel.strip("/")
    path.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        (path / name.replace("_", ".", 1)).write_text(value + "\n")


def test_limits_anywhere_above_a_process_are_found(tmp_path: Path) -> None:
    _cgroup(tmp_path, "/pod", memory_max="1073741824", pids_max="max")
    _cgroup(tmp_path, "/pod/job", cpu_max="max 100000", memory_high="max")
    _cgroup(tmp_path, "/free", memory_max="max", cpuset_cpus="")
    assert limits_on(tmp_path, "/pod/job") == {"/pod/memory.max": "1073741824"}
    _cgroup(tmp_path, "/pod/job", cpu_max="50000 100000")
    assert limits_on(tmp_path, "/pod/job") == {"/pod/job/cpu.max": "50000 100000", "/pod/memory.max": "1073741824"}
    assert limits_on(tmp_path, "/free") == {}
    assert limits_on(tmp_path, "/") == {}


def test_a_limited_process_stays_put(tmp_path: Path) -> None:
    _cgroup(tmp_path, "/pod", pids_max="64")
    _cgroup(tmp_path, "/pod/job")
    _cgroup(tmp_path, "/free/job")
    placer = CgroupPlacer(enabled=False)
    placer.root, placer.base = tmp_path, tmp_path / "krex"
    placer.base.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        placer.cgroup_of = lambda pid: "/pod/job"
        assert placer.place("s1", proc.pid) == ""
        assert not (placer.base / "s1").exists()
        placer.cgroup_of = lambda pid: "/free/job"  # no limit above it: it moves
        assert placer.place("s2", proc.pid) == str(placer.base / "s2")
        assert (placer.base / "s2" / "cgroup.procs").read_text() == str(proc.pid)
    finally:
        proc.kill()
        proc.wait()
