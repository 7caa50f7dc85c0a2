"""Pytest fixtures for code that talks to a KREX arbiter: a real ``krex arbiter`` process (fake
backend) on a private runtime dir, and small waiting helpers.

Enable it from a ``conftest.py`` (as ``jupyter_server.pytest_plugin`` is enabled)::

    pytest_plugins = ["krex_lab.pytest_plugin"]

Fixtures: ``arbiter`` (a started :class:`ArbiterProc`, made the test process's default; stopped
after), ``stopped`` (a SIGSTOPped ``sleep``). Helpers: :func:`running_arbiter` (the same as a
generator, for fixtures with other options), :func:`wait_for`, :func:`cpu_gain`. Only pytest
imports this module; ``import krex_lab`` does not.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import krex_lab
from krex_lab import launcher

#: The directory that holds the ``krex_lab`` package (a checkout's root, or site-packages).
ROOT = Path(krex_lab.__file__).resolve().parent.parent


def subprocess_pythonpath() -> str:
    """``PYTHONPATH`` for child processes: :data:`ROOT` first, then the caller's own."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


class ArbiterProc:
    """A ``krex arbiter`` subprocess on ``runtime`` (its socket ``runtime/arbiter.sock``)."""

    def __init__(
        self,
        runtime: Path,
        gpus: int = 2,
        extra: tuple[str, ...] = (),
        backend: str = "fake",
        log_path: Path | None = None,
    ) -> None:
        self.runtime = runtime
        self.backend = backend
        self.endpoint = f"ipc://{runtime / 'arbiter.sock'}"
        self.gpus = gpus
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        #: everything the arbiter (and its guardian) print: a file, never an unread pipe (a full
        #: pipe blocks the arbiter's next log line, and with it every reply); beside the runtime dir
        #: unless given
        self.log_path = log_path if log_path is not None else runtime.parent / f"{runtime.name}-arbiter.log"

    def env(self) -> dict[str, str]:
        """The environment of a process that should use this arbiter."""
        return {
            **os.environ,
            "KREX_RUNTIME_DIR": str(self.runtime),
            "KREX_ENDPOINT": self.endpoint,
            "PYTHONPATH": subprocess_pythonpath(),
        }

    def start(self, timeout: float = 20) -> ArbiterProc:
        """Start it and return once it answers ``hello`` (raises, with its output, if it does not)."""
        from krex_lab import client
        from krex_lab.errors import ArbiterUnavailable

        self.proc = proc = launcher.start(
            launcher.command(
                "krex_lab.cli",
                "arbiter",
                "--backend",
                self.backend,
                "--fake-gpus",
                str(self.gpus),
                # A test's regions keep other sessions off their cores, never the machine's other
                # processes (tests running beside it, the developer's shell): the shield's own
                # tests ask for more.
                # KREX_TEST_SHIELD names another (the GPU run of the region tests with cpuset).
                *(
                    ()
                    if any("shield" in a for a in self.extra)
                    else (f"--Arbiter.shield={os.environ.get('KREX_TEST_SHIELD') or 'sessions'}",)
                ),
                # KREX_TEST_CORE_LOCK: the core lock of one of several test processes side by side
                # on a node, whose arbiters' regions move their own sessions only.
                *(
                    (f"--Arbiter.core_lock={lock}",)
                    if (lock := os.environ.get("KREX_TEST_CORE_LOCK")) and not any("core_lock" in a for a in self.extra)
                    else ()
                ),
                *self.extra,
            ),
            self.log_path,
            env=self.env(),
        )

        def answers() -> bool:
            try:
                client.hello(self.endpoint, timeout=0.5)  # waits up to 0.5 s for the socket to answer
                return True
            except ArbiterUnavailable:
                return False  # no socket yet: connecting fails at once, so poll

        if not launcher.wait_until(answers, lambda: proc.poll() is None, timeout):
            raise RuntimeError(f"arbiter did not start:\n{self.output()}")
        return self

    def output(self) -> str:
        """What the arbiter and its guardian have printed so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def status(self) -> dict[str, Any]:
        """The arbiter's status; an arbiter that does not answer is reported with its last output."""
        from krex_lab import client
        from krex_lab.errors import ArbiterUnavailable

        try:
            return client.status(self.endpoint)
        except ArbiterUnavailable as exc:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGUSR1)  # every thread's stack, into its output
                time.sleep(0.5)
            raise ArbiterUnavailable(
                f"{exc}\n--- the arbiter's output, last lines ---\n{self.output()[-6000:]}"
            ) from None

    def guardian_pid(self) -> int | None:
        """The pid of this arbiter's guardian process, if one runs."""
        assert self.proc is not None
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if "krex_lab.arbiter.guardian" in cmd and str(self.proc.pid) in cmd:
                return int(p.pid)
        return None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc:
            launcher.stop(self.proc, 10)


def running_arbiter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: tuple[str, ...] = (), gpus: int = 2
) -> Iterator[ArbiterProc]:
    """A started arbiter on a private runtime dir, made this process's default; stopped after."""
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    arb = ArbiterProc(runtime, gpus=gpus, extra=extra)
    monkeypatch.setenv("KREX_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("KREX_ENDPOINT", arb.endpoint)
    arb.start()
    yield arb
    from krex_lab import client

    client.detach()
    arb.stop()


@pytest.fixture
def krex_arbiter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ArbiterProc]:
    """A started arbiter (fake backend, 2 GPUs) on a private runtime dir; this process's default."""
    yield from running_arbiter(tmp_path, monkeypatch)


def cpu_gain(pid: int, seconds: float = 0.3) -> float:
    """CPU seconds a process (and its descendants) gains over ``seconds`` of wall time (0 when frozen)."""
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
    time.sleep(seconds)  # the measuring window: the sleep is the point
    return total() - before


def wait_for(predicate: Callable[[], object], timeout: float = 5.0, interval: float = 0.01) -> float:
    """Poll until ``predicate()`` is true; returns the seconds it took (fails the test on timeout)."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)
    return time.monotonic() - t0


@pytest.fixture
def krex_stopped() -> Iterator[subprocess.Popen[bytes]]:
    """A real ``sleep``, SIGSTOPped as a region would stop it (journal and undo tests); killed after."""
    from krex_lab.procutil import proc_state, start_time

    proc = subprocess.Popen(["sleep", "120"])
    wait_for(lambda: start_time(proc.pid) is not None)
    os.kill(proc.pid, signal.SIGSTOP)
    wait_for(lambda: proc_state(proc.pid) == "T")
    yield proc
    proc.kill()
    proc.wait()
