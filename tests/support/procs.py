"""Session processes for the tests: ``python -m tests.procs.session`` next to a real arbiter."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
from collections.abc import Iterator

import psutil

from krex_lab.pytest_plugin import ArbiterProc
from tests.support import ROOT


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
            try:
                for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
                    p.send_signal(signal.SIGCONT)
                    p.kill()
            except psutil.Error:
                pass
            proc.wait()


def session_processes(arb: ArbiterProc) -> Iterator[Procs]:
    p = Procs(arb.env())
    yield p
    p.cleanup()
