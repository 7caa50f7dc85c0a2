"""Session processes for the tests: ``python -m tests.procs.session`` next to a real arbiter."""

from __future__ import annotations

import contextlib
import json
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psutil

from krex_lab.pytest_plugin import ArbiterProc
from tests.support import ROOT


def descendants_with(pid: int, *words: str) -> list[psutil.Process]:
    """The live descendants of ``pid`` whose command line holds every one of ``words``.

    A child that exits (or is a zombie not yet reaped) while the list is read is left out: its
    command line can no longer be read, and it is no longer running.
    """
    found = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            cmdline = p.cmdline()
        except psutil.Error:
            continue
        if all(any(w in arg for arg in cmdline) for w in words):
            found.append(p)
    return found


def kill_tree(proc: subprocess.Popen[Any] | int, timeout: float = 10) -> None:
    """SIGCONT then SIGKILL a process and every descendant; for a Popen, wait for them all.

    The descendants are listed before anything is killed: once a wrapper (``unshare --fork``, a
    shell) dies, its children are reparented and can no longer be found from it, and a test that
    kills only the wrapper leaves them running after the suite.
    """
    pid = proc if isinstance(proc, int) else proc.pid
    try:
        root = psutil.Process(pid)
        family = [*root.children(recursive=True), root]
    except psutil.Error:
        family = []
    for p in family:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGCONT)  # none may stay stopped
            p.kill()
    if not isinstance(proc, int):  # a bare pid's caller reaps it (its Popen keeps the exit code)
        proc.wait(timeout)
        psutil.wait_procs(family[:-1], timeout=timeout)


class Procs:
    """Test processes, killed (and continued, so none stays stopped) at teardown."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.procs: list[subprocess.Popen[str]] = []

    def start(
        self, *args: str, wait_line: str | None = "ready", user_env: dict[str, str] | None = None
    ) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.procs.session", *args],
            cwd=ROOT,
            env={**self.env, **(user_env or {})},
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        if wait_line:
            line = self.readline(proc)
            assert line.startswith(wait_line), line
        return proc

    @staticmethod
    def readline(proc: subprocess.Popen[str], timeout: float = 20) -> str:
        assert proc.stdout is not None
        r, _, _ = select.select([proc.stdout], [], [], timeout)
        assert r, f"no output from pid {proc.pid} within {timeout} s"
        return proc.stdout.readline()

    @staticmethod
    def report(line: str) -> dict:
        return json.loads(line.split(" ", 1)[1])

    def cleanup(self) -> None:
        for proc in self.procs:
            kill_tree(proc)


def session_processes(arb: ArbiterProc) -> Iterator[Procs]:
    p = Procs(arb.env())
    yield p
    p.cleanup()
