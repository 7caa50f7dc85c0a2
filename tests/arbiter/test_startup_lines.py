"""What ``krex arbiter`` and ``krex lab`` say when they start.

One default number of simulated GPUs for ``krex arbiter``, ``krex lab`` and the extension's embedded
arbiter (one constant), said in the start-up line; a second ``krex arbiter`` on a runtime dir that
one already serves says so in one line and exits non-zero.
"""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from krex_lab import client, gpu
from krex_lab.errors import ArbiterUnavailable
from krex_lab.pytest_plugin import ArbiterProc, subprocess_pythonpath, wait_for

pytestmark = pytest.mark.timeout(90)


def _env(runtime: Path) -> dict[str, str]:
    env = {**os.environ, "KREX_RUNTIME_DIR": str(runtime), "PYTHONPATH": subprocess_pythonpath()}
    env.pop("KREX_ENDPOINT", None)
    return env


def _arbiter(runtime: Path, *args: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "krex_lab.cli", "arbiter", "--no-guardian", *args],
            env=_env(runtime),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _serving(proc: subprocess.Popen[bytes], runtime: Path, log: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            client.hello(f"ipc://{runtime / 'arbiter.sock'}", timeout=0.5)
            break
        except ArbiterUnavailable:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    deadline = time.monotonic() + 5  # the start-up line is logged right after the socket is bound
    while "serving on" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(15)


def test_lab_and_arbiter_share_one_default_said_at_start_up(tmp_path: Path) -> None:
    default = getattr(gpu, "FAKE_GPUS", None)
    assert isinstance(default, int) and default >= 1, "one constant: krex_lab.gpu.FAKE_GPUS"
    from krex_lab.arbiter.server import Arbiter
    from krex_lab.cli import build_parser
    from krex_lab.serverext.app import KrexExtensionApp
    from krex_lab.serverext.processes import Options

    assert Arbiter.class_traits()["fake_gpus"].default() == default
    assert KrexExtensionApp.class_traits()["fake_gpus"].default() == default
    assert Options().fake_gpus == default
    assert inspect.signature(gpu.make_backend).parameters["fake_gpus"].default == default
    assert build_parser().parse_args(["lab"]).fake_gpus == default

    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    log = tmp_path / "arbiter.log"
    proc = _arbiter(runtime, "--backend", "fake", log=log)
    try:
        _serving(proc, runtime, log)
        assert client.hello(f"ipc://{runtime / 'arbiter.sock'}")["gpus"] == default
    finally:
        _stop(proc)
    lines = log.read_text().splitlines()
    start = [line for line in lines if "serving on" in line]
    assert len(start) == 1 and f"{default} simulated GPUs (the default" in start[0], lines


def test_lab_says_the_simulated_default() -> None:
    """`krex lab`'s one line on the arbiter it uses names the simulated GPUs' default, loudly."""
    import logging

    from krex_lab.protocol import Info
    from krex_lab.serverext.arbiter_kind import using_line

    info = Info(
        version="0",
        protocol=1,
        pid=42,
        gpus=gpu.FAKE_GPUS,
        identity="",
        events="",
        backend="fake",
        simulated=True,
        capabilities={},
    )
    level, line = using_line("embedded arbiter (this server's own)", "ipc:///x/arbiter.sock", info)
    assert level == logging.WARNING
    assert f"{gpu.FAKE_GPUS} SIMULATED GPU(s) (the default" in line and "--fake-gpus" in line, line


def test_a_second_arbiter_says_one_line_and_fails(tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = _arbiter(runtime, "--backend", "auto", log=first_log)
    try:
        _serving(first, runtime, first_log)
        second = _arbiter(runtime, "--backend", "auto", log=second_log)
        assert second.wait(30) != 0
        lines = second_log.read_text().splitlines()
        assert len(lines) == 1, lines
        assert "another arbiter" in lines[0] and f"pid {first.pid}" in lines[0], lines
        assert first.poll() is None, "the first one keeps serving"
    finally:
        _stop(first)
    started = [line for line in first_log.read_text().splitlines() if "krex arbiter stopped" not in line]
    assert len(started) == 1 and "serving on" in started[0], f"one start-up line: {started}"


def test_sigusr1_writes_every_threads_stack_to_the_log_and_the_arbiter_serves_on(arbiter: ArbiterProc) -> None:
    assert arbiter.proc is not None
    arbiter.proc.send_signal(signal.SIGUSR1)

    # faulthandler writes one thread after another: wait for the main thread's and the history
    # writer's stacks themselves, not for the first header (a fresh-clone run read the file between).
    def dumped() -> bool:
        out = arbiter.output()
        return "krex_lab/arbiter/app.py" in out and "krex_lab/arbiter/history.py" in out

    try:
        wait_for(dumped, timeout=5)
    except AssertionError:
        pytest.fail(f"no stack of the main thread and the history writer in the log:\n{arbiter.output()[-2000:]}")
    assert arbiter.status()["gpus"], "still serving"
