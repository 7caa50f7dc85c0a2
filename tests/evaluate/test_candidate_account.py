"""The candidate's processes as the judge accounts them (krex_lab.evaluate.judge.account): a
cgroup of their own counts the CPU time of threads that exited and of children, a freeze stops
every one of them, and nothing is left behind; without a cgroup, /proc's figures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from krex_lab.evaluate.judge.account import CandidateGroup, place

#: burns ``S`` seconds of CPU in a thread that then exits, then in a child it reaps, then waits
WORKER = """
import os, sys, threading, time
def burn(s):
    end = time.process_time() + s
    while time.process_time() < end:
        pass
sys.stdin.readline()
t = threading.Thread(target=burn, args=(0.3,)); t.start(); t.join()
pid = os.fork()
if pid == 0:
    end = time.thread_time() + 0.3
    while time.thread_time() < end:
        pass
    os._exit(0)
os.waitpid(pid, 0)
print("done", flush=True)
sys.stdin.readline()
"""

SPINNER = "import sys\nsys.stdout.write('up\\n'); sys.stdout.flush()\nwhile True: pass\n"


@pytest.fixture
def worker() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    yield proc
    proc.kill()
    proc.wait()


def _run_work(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "done"


@pytest.mark.parametrize("kind", ["v2", "v1", "proc"])
def test_work_in_an_exited_thread_and_a_child_is_counted(kind: str, worker: subprocess.Popen[str]) -> None:
    group = place(worker.pid, lambda: [], kinds=(kind,) if kind != "proc" else ())
    try:
        if kind != "proc" and group.kind == "proc":
            pytest.skip(f"no cgroup {kind} here: {group.why}")
        assert group.kind == kind and group.holds(worker.pid), group.accounting
        before = group.cpu_seconds()
        _run_work(worker)
        used = group.cpu_seconds() - before
        # 0.6 s burnt by a thread that exited and a child that was reaped, none of it live now
        assert used >= 0.55, (kind, used)
    finally:
        group.remove()
    if group.path is not None:
        assert not group.path.exists()


def test_freeze_stops_every_process_of_the_group_and_thaw_lets_them_go_on() -> None:
    procs = [subprocess.Popen([sys.executable, "-c", SPINNER], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "up"
        # the second one is "known" (outside the cgroup: a shield partition took it, say)
        group = place(procs[0].pid, lambda: [procs[1].pid])
        try:
            group.freeze()
            before = [_cpu(p.pid) for p in procs]
            time.sleep(0.3)
            assert [_cpu(p.pid) for p in procs] == before  # frozen: no CPU time gained
            group.thaw()
            time.sleep(0.3)
            assert all(_cpu(p.pid) > b for p, b in zip(procs, before))
            assert all(_state(p.pid) not in ("T", "t") for p in procs)  # never left stopped
        finally:
            group.remove()
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_remove_kills_what_is_left_and_removes_the_cgroup() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SPINNER], stdout=subprocess.PIPE, text=True)
    try:
        group = place(proc.pid, lambda: [])
        if group.path is None:
            pytest.skip(f"no cgroup here: {group.why}")
        group.freeze()
        group.remove()  # thawed first, killed, removed
        assert proc.wait(5) == -signal.SIGKILL
        assert not group.path.exists()
    finally:
        proc.kill()
        proc.wait()


def test_a_group_that_cannot_be_made_says_why_and_uses_proc(worker: subprocess.Popen[str]) -> None:
    group = CandidateGroup(worker.pid, lambda: [], None, "proc", "not root")
    assert "/proc" in group.accounting and "not root" in group.accounting
    assert group.cpu_seconds() >= 0


def _cpu(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (
        int(fields[11])
        + int(fields[12])
        + sum(
            int(Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[0]) for t in os.listdir(f"/proc/{pid}/task")
        )
    )


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
