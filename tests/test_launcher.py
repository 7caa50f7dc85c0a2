"""The one way a service is started: a child that ends with its parent, however the parent dies;
a wait that ends as soon as the child is gone; a stop that kills what ignores SIGTERM. Real
processes throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from krex_lab import launcher
from krex_lab.pytest_plugin import subprocess_pythonpath, wait_for

#: a module run as ``__main__`` that sleeps (the guard runs modules, as the services are)
SLEEPER = ("timeit", "-n", "1", "-r", "1", "import time; time.sleep(60)")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _parent_of_a_child(start: str) -> tuple[subprocess.Popen[str], int]:
    """A parent process that starts a child with the launcher call ``start``, prints its pid and sleeps."""
    lines = ["import os, sys, time", "from krex_lab import launcher", f"proc = {start}", "print(proc.pid, flush=True)"]
    script = "\n".join([*lines, "time.sleep(60)"])
    env = {**os.environ, "PYTHONPATH": subprocess_pythonpath()}
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


@pytest.mark.parametrize(
    "start",
    [
        # the guard (the server extension's services): SIGTERM when the parent dies
        f"launcher.start(launcher.command(*{SLEEPER!r}, parent=os.getpid()), {{log!r}})",
        # Ray's node services: SIGKILL when the parent dies
        "launcher.start([sys.executable, '-c', 'import time; time.sleep(60)'], {log!r}, kill_with_parent=True)",
    ],
    ids=["guard", "kill_with_parent"],
)
def test_a_child_ends_when_its_parent_is_killed(tmp_path: Path, start: str) -> None:
    log = tmp_path / "child.log"
    parent, child = _parent_of_a_child(start.format(log=str(log)))
    try:
        time.sleep(0.5)  # the guard has set its death signal before it runs the module
        assert not _gone(child), log.read_text()
        parent.kill()
        parent.wait()
        wait_for(lambda: _gone(child), timeout=10)
    finally:
        for pid in (parent.pid, child):
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
        parent.wait()


def test_wait_until_returns_the_answer_or_none_once_the_child_is_gone(tmp_path: Path) -> None:
    answers = iter([None, None, "ready"])
    assert launcher.wait_until(lambda: next(answers), lambda: True, timeout=5) == "ready"

    proc = launcher.start([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "dead.log")
    t0 = time.monotonic()
    assert launcher.wait_until(lambda: None, lambda: proc.poll() is None, timeout=30) is None
    assert time.monotonic() - t0 < 10, "a dead child ends the wait, not the timeout"
    assert proc.returncode == 3


def test_start_appends_to_a_private_log_and_gives_no_stdin(tmp_path: Path) -> None:
    log = tmp_path / "svc.log"
    log.write_text("earlier\n")
    code = "import sys; print('out'); print('err', file=sys.stderr); print(repr(sys.stdin.read()))"
    proc = launcher.start([sys.executable, "-c", code], log, private_log=True)
    assert proc.wait(20) == 0
    assert log.read_text().split() == ["earlier", "out", "err", "''"]
    assert log.stat().st_mode & 0o777 == 0o600


def test_stop_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )
    log = tmp_path / "stubborn.log"
    proc = launcher.start([sys.executable, "-c", code], log)
    wait_for(lambda: "ready" in log.read_text(), timeout=20)
    launcher.stop(proc, 0.5)
    assert proc.returncode == -signal.SIGKILL
