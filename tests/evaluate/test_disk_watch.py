"""The judge's disk watch stays out of what is timed: a candidate chooses how long one look at
its build directory takes (thousands of empty files at the end of a deep chain of directories
cost no disk and seconds of ``lstat``), and a look still walking when the timed block began ran
through it, on the judge's CPU time (the reference's figure): the reference read twice its time."""

from __future__ import annotations

import os
import time
from pathlib import Path

from krex_lab.evaluate.judge.disk_watch import DiskWatch


def _cpu(tid: int) -> float:
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def _slow_tree(root: Path, depth: int = 400, files: int = 30000) -> None:
    deep = root.joinpath(*["d"] * depth)
    deep.mkdir(parents=True)
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(files):  # relative to the directory: no walk of the chain per file
            os.close(os.open(f"f{i}", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
    finally:
        os.close(fd)


def test_a_look_under_way_is_given_up_before_a_paused_block(tmp_path: Path) -> None:
    _slow_tree(tmp_path)
    watch = DiskWatch(str(tmp_path), lambda: [], limit=1 << 40).start()
    try:
        tid = watch._thread.native_id
        assert tid is not None
        walking = time.monotonic() + 10
        c0 = _cpu(tid)
        while _cpu(tid) - c0 < 0.05:  # a look is under way
            assert time.monotonic() < walking, "the watch never looked"
            time.sleep(0.01)
        with watch.paused():
            inside = _cpu(tid)
            time.sleep(0.5)
            spent = _cpu(tid) - inside
        assert spent < 0.02, f"the watch walked {spent:.3f} s of CPU inside the paused block"
        assert watch.breached is None and watch.peak == 0  # empty files: nothing on disk
    finally:
        watch.stop()
