"""Crash safety without a human (issue "Hostile neighbours", item 7): SIGKILL of the arbiter and
its guardian together leaves nothing stopped for more than 2 s, and a new arbiter answers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from krex_lab import client
from krex_lab.errors import KrexError
from krex_lab.procutil import children, proc_state, start_time
from krex_lab.pytest_plugin import wait_for


def _arbiter_cmd(rt: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "krex_lab.cli",
        "arbiter",
        "--backend",
        "fake",
        "--fake-gpus",
        "1",
        "--runtime-dir",
        str(rt),
    ]


def _hello(rt: Path, timeout: float = 30.0, not_pid: int | None = None) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            info = client.hello(f"ipc://{rt / 'arbiter.sock'}")
            if info["pid"] != not_pid:
                return info
        except (KrexError, OSError) as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"no arbiter answered on {rt} within {timeout} s: {last}")


def _guardian_of(pid: int) -> int:
    def find() -> int | None:
        for kid in children(pid):
            try:
                if b"krex_lab.arbiter.guardian" in Path(f"/proc/{kid}/cmdline").read_bytes():
                    return kid
            except OSError:
                continue
        return None

    wait_for(lambda: find() is not None, timeout=10.0)
    found = find()
    assert found is not None
    return found


def _journal_stop(rt: Path, proc: subprocess.Popen[bytes]) -> None:
    """Append a `stop` entry to the live arbiter's journal, as its freezer would before a SIGSTOP."""
    entry = {"t": "stop", "region": "crash", "procs": [[proc.pid, start_time(proc.pid)]]}
    fd = os.open(rt / "journal.jsonl", os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
    finally:
        os.close(fd)


def _resumed_within(proc: subprocess.Popen[bytes], seconds: float) -> float:
    t0 = time.monotonic()
    while proc_state(proc.pid) == "T":
        if time.monotonic() - t0 > seconds:
            raise AssertionError(f"process {proc.pid} still stopped {seconds} s after the crash")
        time.sleep(0.005)
    return time.monotonic() - t0


@pytest.fixture
def rt(tmp_path: Path) -> Path:
    path = tmp_path / "rt"
    path.mkdir(mode=0o700)
    return path


def _supervise(rt: Path, tmp_path: Path, *extra: str) -> subprocess.Popen[bytes]:
    log = open(tmp_path / "supervisor.log", "wb")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "krex_lab.arbiter.supervisor",
            "--runtime-dir",
            str(rt),
            *extra,
            "--",
            *_arbiter_cmd(rt),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _end(sup: subprocess.Popen[bytes], tmp_path: Path) -> int:
    if sup.poll() is None:
        sup.send_signal(signal.SIGTERM)
    try:
        return sup.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(sup.pid, signal.SIGKILL)
        sup.wait()
        raise AssertionError("supervisor did not stop: " + (tmp_path / "supervisor.log").read_text()) from None


def test_sigkill_of_arbiter_and_guardian_together(rt: Path, tmp_path: Path, stopped: subprocess.Popen[bytes]) -> None:
    sup = _supervise(rt, tmp_path)
    try:
        first = _hello(rt)["pid"]
        guardian = _guardian_of(first)
        _journal_stop(rt, stopped)
        os.kill(guardian, signal.SIGKILL)
        os.kill(first, signal.SIGKILL)
        took = _resumed_within(stopped, 2.0)
        second = _hello(rt, not_pid=first)["pid"]
        assert second != first and sup.poll() is None
        assert _guardian_of(second) != guardian
        print(f"resumed {took:.3f} s after the SIGKILLs; new arbiter {second}")
    finally:
        rc = _end(sup, tmp_path)
    assert rc == 0, (tmp_path / "supervisor.log").read_text()
    assert (rt / "journal.jsonl").read_bytes() == b""


def test_the_supervisor_undoes_before_it_restarts(rt: Path, tmp_path: Path, stopped: subprocess.Popen[bytes]) -> None:
    """No restart allowed here, so only the supervisor's own undo can resume the process."""
    sup = _supervise(rt, tmp_path, "--max-restarts", "0")
    guardian = 0
    try:
        first = _hello(rt)["pid"]
        guardian = _guardian_of(first)
        os.kill(guardian, signal.SIGSTOP)  # a guardian that cannot run is as good as dead
        _journal_stop(rt, stopped)
        os.kill(first, signal.SIGKILL)
        _resumed_within(stopped, 2.0)
        assert sup.wait(timeout=30) == 1, "restarts exhausted: the supervisor gives up"
        assert "giving up" in (tmp_path / "supervisor.log").read_text()
    finally:
        if guardian:
            os.kill(guardian, signal.SIGKILL)
        if sup.poll() is None:
            _end(sup, tmp_path)


def test_a_clean_stop_ends_the_supervisor(rt: Path, tmp_path: Path) -> None:
    sup = _supervise(rt, tmp_path)
    _hello(rt)
    assert _end(sup, tmp_path) == 0
    assert "restarting" not in (tmp_path / "supervisor.log").read_text()


def test_the_guardian_undoes_when_sigterm_follows_the_crash(
    rt: Path, tmp_path: Path, stopped: subprocess.Popen[bytes]
) -> None:
    """systemd (KillMode=control-group) SIGTERMs the guardian right after the arbiter crashed: the
    guardian must undo, not die. The guardian is held stopped so that SIGTERM lands first."""
    arb = subprocess.Popen(_arbiter_cmd(rt), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _hello(rt)
        guardian = _guardian_of(arb.pid)
        _journal_stop(rt, stopped)
        os.kill(guardian, signal.SIGSTOP)
        wait_for(lambda: proc_state(guardian) == "T")
        arb.kill()
        arb.wait()
        os.kill(guardian, signal.SIGTERM)
        os.kill(guardian, signal.SIGCONT)
        _resumed_within(stopped, 2.0)
        wait_for(lambda: proc_state(guardian) in (None, "Z"), timeout=5.0)
    finally:
        arb.kill()
        arb.wait()


def test_an_arbiter_that_keeps_dying_is_restarted_ever_more_slowly_and_the_log_says_why(
    rt: Path, tmp_path: Path
) -> None:
    """An arbiter that aborts at each start (as libzmq aborts it on EMFILE under a connection flood)."""
    dies = [
        sys.executable,
        "-c",
        "import os, sys; print('Too many open files (src/ipc_listener.cpp:297)', file=sys.stderr); os.abort()",
    ]
    log = open(tmp_path / "supervisor.log", "wb")  # noqa: SIM115 - the child keeps it
    sup = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "krex_lab.arbiter.supervisor",
            "--runtime-dir",
            str(rt),
            "--max-restarts",
            "3",
            "--",
            *dies,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        assert sup.wait(timeout=60) == 1
    finally:
        if sup.poll() is None:
            _end(sup, tmp_path)
    text = (tmp_path / "supervisor.log").read_text()
    restarts = [line for line in text.splitlines() if "restarting in" in line]
    assert len(restarts) == 3, text
    assert all("killed by SIGABRT" in line and "Too many open files" in line for line in restarts), text
    delays = [float(line.rsplit("restarting in ", 1)[1].split()[0]) for line in restarts]
    assert delays == sorted(delays) and delays[-1] > delays[0], delays
    assert "backing off" in restarts[-1]
    assert "giving up" in text and "killed by SIGABRT" in text.splitlines()[-1]
