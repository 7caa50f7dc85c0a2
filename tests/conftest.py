"""Shared fixtures: a real `krex arbiter` process (fake backend) on a private runtime dir."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent


class ArbiterProc:
    def __init__(self, runtime: Path, gpus: int = 2, extra: tuple[str, ...] = (), backend: str = "fake") -> None:
        self.runtime = runtime
        self.backend = backend
        self.endpoint = f"ipc://{runtime / 'arbiter.sock'}"
        self.gpus = gpus
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        return {**os.environ, "KREX_RUNTIME_DIR": str(self.runtime), "KREX_ENDPOINT": self.endpoint,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

    def start(self) -> ArbiterProc:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "krex_lab.cli", "arbiter", "--backend", self.backend, "--fake-gpus", str(self.gpus),
             *self.extra],
            env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        from krex_lab import client
        from krex_lab.errors import ArbiterUnavailable

        deadline = time.monotonic() + 20
        while True:
            try:
                client.hello(self.endpoint, timeout=0.5)
                return self
            except ArbiterUnavailable:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    out = self.proc.stdout.read().decode() if self.proc.stdout else ""
                    raise RuntimeError(f"arbiter did not start:\n{out}") from None
                time.sleep(0.05)

    def status(self) -> dict:
        from krex_lab import client

        return client.status(self.endpoint)

    def guardian_pid(self) -> int | None:
        assert self.proc is not None
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if "krex_lab.arbiter.guardian" in cmd and str(self.proc.pid) in cmd:
                return p.pid
        return None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Procs:
    """Test processes, killed (and continued, so none stays stopped) at teardown."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, *args: str, wait_line: str | None = "ready", user_env: dict[str, str] | None = None
              ) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-m", "tests.procs.session", *args], cwd=ROOT,
                                env={**self.env, **(user_env or {})}, stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        if wait_line:
            line = self.readline(proc)
            assert line.startswith(wait_line), line
        return proc

    @staticmethod
    def readline(proc: subprocess.Popen[str], timeout: float = 20) -> str:
        import select

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


def running_arbiter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: tuple[str, ...] = (),
                    gpus: int = 2) -> Iterator[ArbiterProc]:
    """A started arbiter on a private runtime dir, made this process's default; stopped after."""
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    arb = ArbiterProc(runtime, gpus=gpus, extra=extra)
    monkeypatch.setenv("KREX_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("KREX_ENDPOINT", arb.endpoint)
    arb.start()
    yield arb
    from krex_lab import client

    if client._default is not None:
        client._default.close()
        client._default = None
    arb.stop()


def session_processes(arb: ArbiterProc) -> Iterator[Procs]:
    p = Procs(arb.env())
    yield p
    p.cleanup()


@pytest.fixture
def arbiter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ArbiterProc]:
    yield from running_arbiter(tmp_path, monkeypatch)


@pytest.fixture
def procs(arbiter: ArbiterProc) -> Iterator[Procs]:
    yield from session_processes(arbiter)


def cpu_gain(pid: int, seconds: float = 0.3) -> float:
    """CPU seconds a process gains over ``seconds`` of wall time (0 when it is frozen)."""
    from krex_lab.procutil import cpu_seconds, tree

    def total() -> float:
        s = 0.0
        for p in tree(pid):
            try:
                s += cpu_seconds(p)
            except psutil.Error:
                pass
        return s

    before = total()
    time.sleep(seconds)
    return total() - before


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.01) -> float:  # type: ignore[no-untyped-def]
    """Poll until ``predicate()`` is true; returns the seconds it took (fails the test on timeout)."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)
    return time.monotonic() - t0
