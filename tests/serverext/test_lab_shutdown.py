"""One Ctrl-C stops ``krex lab`` cleanly: a real ``krex lab`` (jupyter_server with the extension, its
embedded arbiter and pool) on a private runtime dir and a free port, then SIGINT (stdin a pipe, or a
terminal, where jupyter_server would ask for confirmation first) or SIGTERM. It must exit within a
few seconds and leave no process, no ``jpserver-*`` file and no socket behind, and say so last."""

from __future__ import annotations

import os
import pty
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from krex_lab.pytest_plugin import ArbiterProc, subprocess_pythonpath, wait_for
from tests.support import ROOT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("how", ["sigint", "sigint-tty", "sigterm"])
def test_one_interrupt_stops_the_lab_cleanly(tmp_path: Path, how: str) -> None:
    jrt, krt, home = tmp_path / "jupyter-runtime", tmp_path / "krex", tmp_path / "home"
    for d in (jrt, krt, home):
        d.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KREX_", "JUPYTER_"))}
    env.update(
        HOME=str(home),
        JUPYTER_RUNTIME_DIR=str(jrt),
        KREX_RUNTIME_DIR=str(krt),
        KREX_NODE_ENDPOINT="",  # never the node's arbiter
        PYTHONPATH=subprocess_pythonpath(),
    )
    log = tmp_path / "lab.log"
    cmd = [sys.executable, "-m", "krex_lab.cli", "lab", "--backend=fake", "--no-browser"]
    cmd += ["--port", str(_free_port()), "--ServerApp.token=", f"--notebook-dir={tmp_path}"]
    tty_parent, tty_child = pty.openpty() if how == "sigint-tty" else (-1, -1)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=tty_child if tty_child >= 0 else subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: ((jrt / f"jpserver-{proc.pid}.json").exists() and (krt / "pool.sock").exists()) or proc.poll(),
            timeout=90,
            interval=0.2,
        )
        assert proc.poll() is None, log.read_text()
        wait_for(lambda: "is running at" in log.read_text(), timeout=30, interval=0.1)
        family = psutil.Process(proc.pid).children(recursive=True)
        assert len(family) >= 2, "the embedded arbiter and the pool run"
        proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"krex lab still runs 15 s after {how}:\n{log.read_text()[-3000:]}")
        text = log.read_text()
        left = [p.pid for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not left, f"left behind: {left}\n{text[-3000:]}"
        assert not list(jrt.glob("jpserver-*")), f"{sorted(os.listdir(jrt))}\n{text[-3000:]}"
        assert not list(krt.glob("*.sock")), f"{sorted(os.listdir(krt))}\n{text[-3000:]}"
        assert "KREX: stopped" in text.strip().splitlines()[-1], text[-3000:]
        assert "Interrupted..." not in text
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for fd in (tty_parent, tty_child):
            if fd >= 0:
                os.close(fd)


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_stop_signal_during_the_socket_bind_stops_cleanly(arbiter: ArbiterProc, tmp_path: Path, signame: str) -> None:
    env = {**arbiter.env(), "JUPYTER_RUNTIME_DIR": str(tmp_path), "HOME": str(tmp_path)}
    cmd = [sys.executable, "-m", "tests.procs.lab_signal_mid_bind", signame, arbiter.endpoint, str(_free_port())]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "stopped fired" in done.stdout, out[-3000:]
    assert "Traceback" not in out and "KeyError" not in out, out[-3000:]
    assert not list(tmp_path.glob("jpserver-*")), "the server's files are gone"
