"""A ``krex`` command in a terminal beside a running ``krex lab`` uses the arbiter the lab uses: the
node's arbiter the lab joined (not another arbiter of the user's), or the embedded one the lab
started in a private runtime dir; ``krex lab`` says which arbiter it uses once, and nothing it did
not use. A lab whose joined arbiter goes away says so loudly and picks it up when it is back,
without starting an arbiter of its own beside it."""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from krex_lab.pytest_plugin import ArbiterProc, subprocess_pythonpath, wait_for
from tests.support.procs import descendants_with

pytestmark = pytest.mark.timeout(180)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(tmp_path: Path, own: Path, node: str) -> dict[str, str]:
    """A user's terminal: no KREX_ENDPOINT, this user's runtime dir ``own``, the node arbiter at ``node``."""
    home, jrt = tmp_path / "home", tmp_path / "jupyter-runtime"
    for d in (home, jrt):
        d.mkdir(mode=0o700, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KREX_", "JUPYTER_"))}
    env.update(
        HOME=str(home),
        JUPYTER_RUNTIME_DIR=str(jrt),
        KREX_RUNTIME_DIR=str(own),
        KREX_NODE_ENDPOINT=node,
        PYTHONPATH=subprocess_pythonpath(),
    )
    return env


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Any]:
    """Start ``krex lab`` (no pool) in an environment; returns (process, log path)."""
    started: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str], *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / "lab.log"
        cmd = [sys.executable, "-m", "krex_lab.cli", "lab", "--backend=fake", "--no-pool", "--no-browser"]
        cmd += ["--port", str(_free_port()), "--ServerApp.token=", f"--notebook-dir={tmp_path}", *extra]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        started.append(proc)
        wait_for(lambda: lab_url(log) or proc.poll() is not None, timeout=120, interval=0.2)
        assert proc.poll() is None, log.read_text()
        return proc, log

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def lab_url(log: Path) -> str:
    """The address the lab serves at, once its log says it runs (the last one it names: Jupyter
    moves to the next port where the one asked for was taken meanwhile); "" before."""
    text = log.read_text()
    running = text.rfind("is running at")
    found = re.findall(r"http://127\.0\.0\.1:\d+", text[running:]) if running >= 0 else []
    return found[-1] if found else ""


def _krex_status(env: dict[str, str]) -> dict[str, Any]:
    """``krex status --json`` in a terminal of this user (not the lab's: no KREX_ENDPOINT)."""
    done = subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "status", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    table: dict[str, Any] = json.loads(done.stdout)
    return table


def _arbiter_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if ("arbiter" in line and "KREX:" in line) or "krex lab:" in line]


def test_krex_status_beside_a_lab_on_the_node_arbiter_finds_that_one(lab: Any, tmp_path: Path) -> None:
    node_rt, own = tmp_path / "node-rt", tmp_path / "own-rt"
    node_rt.mkdir(mode=0o700)
    own.mkdir(mode=0o700)
    node = ArbiterProc(node_rt).start()
    mine = ArbiterProc(own)  # another arbiter of this user's, started once the lab runs
    try:
        env = _env(tmp_path, own, node.endpoint)
        proc, log = lab(env)
        text = log.read_text()
        said = _arbiter_lines(text)
        assert "embedded" not in text, f"the lab says it uses an arbiter it does not: {said}"
        assert len([line for line in said if "using the" in line]) == 1, said
        assert "using the node arbiter (" in text and node.endpoint in text, said
        mine.start()
        assert node.proc is not None and mine.proc is not None
        # The terminal knows nothing of the node (its KREX_NODE_ENDPOINT is not set there, as on a
        # node whose arbiter is not at the default place): only the lab's record leads it there.
        assert _krex_status({**env, "KREX_NODE_ENDPOINT": ""})["arbiter"]["pid"] == node.proc.pid
        # Where the node arbiter is where the terminal looks first: the same one, lab or no lab.
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        assert not list(own.glob("lab-*.json")), "the lab's record goes with it"
        assert _krex_status(env)["arbiter"]["pid"] == node.proc.pid
        assert _krex_status({**env, "KREX_NODE_ENDPOINT": ""})["arbiter"]["pid"] == mine.proc.pid
    finally:
        mine.stop()
        node.stop()


def test_krex_status_finds_the_labs_embedded_arbiter_in_its_private_runtime_dir(lab: Any, tmp_path: Path) -> None:
    own = tmp_path / "own-rt"
    own.mkdir(mode=0o700)
    # An arbiter that holds this user's runtime dir but does not answer: the lab's embedded
    # arbiter goes to a private runtime dir of its own, where no default would look.
    with open(own / "arbiter.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        env = _env(tmp_path, own, "")
        proc, log = lab(env)
        embedded = descendants_with(proc.pid, "arbiter")
        assert embedded, log.read_text()
        table = _krex_status(env)
        assert "krex-lab-" in table["arbiter"]["endpoint"], table["arbiter"]
        assert table["arbiter"]["pid"] in {p.pid for p in embedded}
        said = [line for line in _arbiter_lines(log.read_text()) if "using the" in line]
        assert len(said) == 1 and "embedded arbiter" in said[0] and "SIMULATED" in said[0], said


def test_a_joined_arbiter_that_goes_away_is_said_loudly_and_picked_up_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from krex_lab.serverext.processes import Options, Services

    node_rt, own = tmp_path / "node-rt", tmp_path / "own-rt"
    node_rt.mkdir(mode=0o700)
    own.mkdir(mode=0o700)
    monkeypatch.delenv("KREX_ENDPOINT", raising=False)
    monkeypatch.setenv("KREX_RUNTIME_DIR", str(own))
    node = ArbiterProc(node_rt).start()
    services = Services(Options(node_endpoint=node.endpoint, start_pool=False), logger=logging.getLogger("krex.t"))
    try:
        with caplog.at_level(logging.INFO, logger="krex.t"):
            services.start()
            assert services.kind == "node"
            services.check()
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
            node.stop()
            services.check()
            services.check()  # said once, not at every check
            gone = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
            assert len(gone) == 1 and "node arbiter" in gone[0] and "GONE" in gone[0], gone
            assert "administrator" in gone[0] and "picks it up again" in gone[0], gone
            assert services.describe().problems == [gone[0][len("KREX: ") :]]
            # Not replaced by an arbiter of its own: two would each give the GPUs away.
            assert services.arbiter is None
            assert not descendants_with(os.getpid(), "arbiter")
            caplog.clear()
            node.start()
            services.check()
            back = [r.getMessage() for r in caplog.records if "is back" in r.getMessage()]
            assert len(back) == 1 and f"pid {node.proc.pid if node.proc else '?'}" in back[0], caplog.text
            assert services.describe().problems == []
    finally:
        asyncio.run(services.stop())
        node.stop()


def test_a_joined_arbiter_of_ones_own_that_goes_away_is_replaced_by_the_embedded_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from krex_lab import client
    from krex_lab.serverext.processes import Options, Services

    own = tmp_path / "own-rt"
    own.mkdir(mode=0o700)
    monkeypatch.delenv("KREX_ENDPOINT", raising=False)
    monkeypatch.setenv("KREX_RUNTIME_DIR", str(own))
    mine = ArbiterProc(own).start()  # a `krex arbiter` of this user's, in a terminal
    services = Services(Options(node_endpoint="", start_pool=False), logger=logging.getLogger("krex.t"))
    try:
        with caplog.at_level(logging.INFO, logger="krex.t"):
            services.start()
            assert services.kind == "user" and services.arbiter is None
            mine.stop()
            services.check()
            said = [r.getMessage() for r in caplog.records if "in its place" in r.getMessage()]
            assert len(said) == 1 and "arbiter of this user" in said[0], caplog.text
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
        assert services.kind == "embedded" and services.arbiter is not None and services.arbiter.alive()
        # At the same endpoint: the kernels, which were given it, find the new one there.
        assert services.endpoint == mine.endpoint
        assert services.info is not None
        assert client.hello(mine.endpoint)["pid"] == services.info.pid == services.arbiter.pid
        assert services.describe().problems == []
    finally:
        asyncio.run(services.stop())
        mine.stop()


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root's runtime dir is /run/krex in every session: only another user's follows XDG"
)
def test_a_terminal_of_another_session_finds_the_labs_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lab started in an `su` shell (no XDG_RUNTIME_DIR: a runtime dir in /tmp), the terminal
    in a login session (XDG_RUNTIME_DIR set): another runtime dir, and still the lab's arbiter."""
    from krex_lab import discovery, paths

    arb = ArbiterProc(tmp_path / "lab-rt").start()
    had = set(paths._own_tmp_dirs())
    try:
        for name in ("KREX_ENDPOINT", "KREX_RUNTIME_DIR", "XDG_RUNTIME_DIR"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("KREX_NODE_ENDPOINT", "")
        lab_dir = paths.runtime_dir()
        record = discovery.write_lab_record(lab_dir, arb.endpoint, "embedded")  # this process plays the lab
        try:
            xdg = tmp_path / "xdg"
            xdg.mkdir(mode=0o700)
            monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
            assert paths.runtime_dir() != lab_dir
            assert discovery.default_endpoint() == arb.endpoint
        finally:
            record.unlink()
        assert discovery.default_endpoint() == f"ipc://{xdg / 'krex' / 'arbiter.sock'}"
    finally:
        arb.stop()
        for made in set(paths._own_tmp_dirs()) - had:  # the su shell's runtime dir this test made
            shutil.rmtree(made, ignore_errors=True)
