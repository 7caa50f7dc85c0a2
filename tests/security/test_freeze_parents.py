"""Freezing never leaves anything stopped that was not stopped before (hostile neighbours, round two).

``alice``'s session runs under a parent that waits for it: ``runuser``, ``su`` and ``sudo`` stop
*themselves* when they see their child stop (``WUNTRACED``), and a job-control shell (``bash -i``
under a pty) takes its terminal back. ``mallory``'s region freezes alice's session. Before, the
thaw continued only the processes it had stopped: the root ``runuser`` stayed in state T and
alice's command never returned. Now nothing of alice's family is stopped after the region that
was not before it, with SIGSTOP (``--cgroups off``) and with the cgroup freezer where the machine
allows it (the default of a root multi-user arbiter: ``--cgroups auto``).
"""

from __future__ import annotations

import contextlib
import os
import pty
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from krex_lab.enforcement.cgroups import CgroupPlacer
from krex_lab.procutil import proc_state
from krex_lab.pytest_plugin import wait_for

from .helpers_arbiter import Agent, agents, assert_healthy, kill_tree, multi_user_arbiter
from .users import User


def _start_under(parent: str, alice: User) -> tuple[subprocess.Popen[bytes], int | None]:
    """``sleep`` as alice under ``parent``; returns the parent's Popen (and a pty's master fd)."""
    if parent == "runuser":
        argv = ["runuser", "-u", alice.name, "--", "sleep", "600"]
    elif parent == "su":
        argv = ["su", alice.name, "-s", "/bin/sh", "-c", "exec sleep 600"]
    elif parent == "sudo":
        if shutil.which("sudo") is None:
            pytest.skip("sudo is not installed")
        argv = ["sudo", "-u", alice.name, "sleep", "600"]
    else:  # a job-control shell of alice's on a terminal, running sleep as its foreground job
        master, slave = pty.openpty()
        shell = subprocess.Popen(
            ["setpriv", f"--reuid={alice.uid}", f"--regid={alice.gid}", "--clear-groups", "bash", "--norc", "-i"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            env={"PATH": "/usr/bin:/bin", "HOME": "/", "TERM": "dumb"},
            cwd="/",
            preexec_fn=lambda: __import__("fcntl").ioctl(0, __import__("termios").TIOCSCTTY, 0),
        )
        os.close(slave)
        time.sleep(0.5)
        os.write(master, b"sleep 600\n")
        return shell, master
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd="/"), None


def _sleep_of(parent: subprocess.Popen[bytes]) -> int:
    def found() -> int | None:
        for p in psutil.Process(parent.pid).children(recursive=True):
            if p.name() == "sleep":
                return p.pid
        return None

    wait_for(lambda: found() is not None, timeout=10)
    pid = found()
    assert pid is not None
    return pid


def _stopped(pids: list[int]) -> set[int]:
    return {p for p in pids if proc_state(p) in ("T", "t")}


@pytest.mark.parametrize("cgroups", ["off", "default"])
@pytest.mark.parametrize("parent", ["runuser", "su", "sudo", "bash -i"])
def test_a_region_leaves_no_parent_stopped(alice: User, mallory: User, parent: str, cgroups: str) -> None:
    flags = () if cgroups == "default" else (f"--cgroups={cgroups}",)
    with multi_user_arbiter(*flags) as arb, agents() as made:
        # krex status says which freezer is in use: a root multi-user arbiter's default is the
        # cgroup freezer wherever the machine has a cgroup v2 hierarchy it may manage
        table = subprocess.run(
            [sys.executable, "-m", "krex_lab.cli", "status"], env=arb.env(), capture_output=True, text=True
        ).stdout
        expected = "SIGSTOP" if cgroups == "off" or not CgroupPlacer(True).enabled else "cgroup v2"
        assert f"freezer: {expected}" in table, table
        proc, master = _start_under(parent, alice)
        try:
            sleep = _sleep_of(proc)
            family = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
            before = _stopped(family)
            # alice's session is that sleep (registered by a process of hers, which acks drains)
            a = Agent(alice, arb)
            made.append(a)
            reg = a.call("register", tag="a", gpu=0, pid=sleep)
            assert reg["ok"], reg
            # mallory's region freezes it
            m = Agent(mallory, arb)
            made.append(m)
            assert m.call("register", tag="m", gpu=0)["ok"]
            m.call("acquire", tag="r", session="m", opts={"gpu": 0, "max_hold": 30})
            granted = m.event("granted|acquire_failed", "r")
            assert granted["event"] == "granted", granted
            assert sleep in granted["report"]["frozen"], granted["report"]
            time.sleep(0.5)  # long enough for a parent to notice its child stopped
            assert m.call("release", tag="r")["ok"]
            time.sleep(1.0)  # the thaw and the looks after it
            now = _stopped(family)
            states = {p: proc_state(p) for p in family}
            print(f"{parent} ({cgroups}): stopped before {sorted(before)}, after {sorted(now)}; states {states}")
            assert now <= before, f"left stopped by the region: {sorted(now - before)} ({states})"
            assert proc.poll() is None, "the parent ended"
            assert proc_state(sleep) in ("S", "R"), states
        finally:
            if master is not None:
                os.close(master)
            kill_tree(proc)
        assert_healthy(arb, {alice.uid, mallory.uid})


def _guardian_of(pid: int) -> int:
    def find() -> int | None:
        for kid in psutil.Process(pid).children():
            with contextlib.suppress(psutil.Error):
                if "krex_lab.arbiter.guardian" in " ".join(kid.cmdline()):
                    return kid.pid
        return None

    wait_for(lambda: find() is not None, timeout=10.0)
    found = find()
    assert found is not None
    return found


@pytest.mark.parametrize("killed", ["arbiter and guardian", "arbiter"])
def test_a_crash_in_sigstop_mode_leaves_no_wrapper_stopped(alice: User, mallory: User, killed: str) -> None:
    """mallory's region freezes alice's session, started through root ``runuser`` (which stops
    itself when its child stops). The arbiter (and its guardian) are SIGKILLed inside the region:
    whoever undoes the journal (the guardian, or the restarted arbiter) must continue the wrapper
    too, not only alice's process. Before the wrapper was journaled, it stayed in T for good and
    alice's command never returned."""
    with multi_user_arbiter("--cgroups=off", "--guard-neighbours") as arb, agents() as made:
        proc, _ = _start_under("runuser", alice)
        try:
            sleep = _sleep_of(proc)
            a = Agent(alice, arb)
            made.append(a)
            assert a.call("register", tag="a", gpu=0, pid=sleep)["ok"]
            m = Agent(mallory, arb)
            made.append(m)
            assert m.call("register", tag="m", gpu=0)["ok"]
            m.call("acquire", tag="r", session="m", opts={"gpu": 0, "max_hold": 60})
            granted = m.event("granted|acquire_failed", "r")
            assert granted["event"] == "granted", granted
            assert sleep in granted["report"]["frozen"], granted["report"]
            wait_for(lambda: proc_state(proc.pid) == "T", timeout=5.0)  # runuser stopped itself
            assert arb.proc is not None
            guardian = _guardian_of(arb.proc.pid)
            if killed != "arbiter":
                os.kill(guardian, signal.SIGKILL)
            os.kill(arb.proc.pid, signal.SIGKILL)
            arb.proc.wait()
            if killed != "arbiter":
                arb.start()  # a restarted arbiter undoes its journal before it serves
            time.sleep(5.0)
            states = {p: proc_state(p) for p in (proc.pid, sleep)}
            print(f"{killed} killed: states 5 s later {states}")
            assert states[sleep] in ("S", "R"), states
            assert states[proc.pid] in ("S", "R"), f"runuser left stopped: {states}"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            kill_tree(proc)
            if killed == "arbiter":  # the guardian ends once it has undone; start one to stop
                arb.start()
