"""Pools that start, stop and refuse: on demand (and idle exit), SIGTERM (nothing left behind),
preloaded numba in the CUDA simulator, a socket only its user can reach, tcp refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from krex_lab.pytest_plugin import ArbiterProc, running_arbiter, wait_for
from krex_lab.workers.client import PoolClient
from krex_lab.workers.results import JobResult
from tests.support import ROOT
from tests.support.pool import PoolProc, alive, krex_run


@pytest.fixture(scope="module")
def arb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArbiterProc]:
    with pytest.MonkeyPatch.context() as mp:
        yield from running_arbiter(tmp_path_factory.mktemp("arb"), mp, gpus=1)


NUMBA_KERNEL = """
import numpy as np
from numba import cuda

@cuda.jit
def add(a, b, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a[i] + b[i]

a = np.arange(64, dtype=np.float32)
out = np.zeros_like(a)
add[2, 32](a, 2 * a, out)
float(out.sum())
"""


def test_numba_kernel_runs_on_a_preloaded_worker(arb: ArbiterProc) -> None:
    env = {**arb.env(), "NUMBA_ENABLE_CUDASIM": "1"}
    pool = PoolProc(
        env,
        f"ipc://{arb.runtime / 'numba.sock'}",
        "--Pool.preload=numba.cuda",
        "--Pool.preload=not_a_module_xyz",
        "--workers-per-gpu=1",
        "--spares=0",
        log=arb.runtime / "numba.log",
    )
    pool.start(timeout=90)
    try:
        worker = pool.status().gpus[0].workers[0]
        assert worker.preloaded == ["numba.cuda"]
        assert "not_a_module_xyz" in worker.skipped  # optional: skipped, the worker still serves
        result = pool.client.run_code(NUMBA_KERNEL)
        assert result.ok, result
        assert result.value == repr(3.0 * sum(range(64)))
        again = pool.client.run_code(
            "import numba.cuda\nnumba.cuda.simulator_enabled if hasattr(numba.cuda, 'simulator_enabled') else 'sim'"
        )
        assert again.ok and again.worker_pid == result.worker_pid  # warm: the same worker, no recycle
    finally:
        pool.stop()


def test_sigterm_stops_every_worker_and_leaves_nothing(arb: ArbiterProc) -> None:
    # An endpoint in a world-traversable directory: only the socket's own mode keeps others out.
    open_dir = Path(tempfile.mkdtemp(prefix="krex-open-"))
    os.chmod(open_dir, 0o755)
    sock = open_dir / "pool.sock"
    pool = PoolProc(
        arb.env(), f"ipc://{sock}", "--no-preload", "--workers-per-gpu=1", "--spares=1", log=arb.runtime / "term.log"
    )
    try:
        pool.start()
        assert os.stat(sock).st_mode & 0o777 == 0o600
        if os.getuid() == 0 and shutil.which("setpriv"):
            probe = (
                "import sys\nfrom krex_lab.workers.client import PoolClient\n"
                f"try:\n    PoolClient.connect('ipc://{sock}', start=False)\nexcept Exception as e:\n"
                "    print(type(e).__name__); sys.exit(3)\nprint('connected')\n"
            )
            other = subprocess.run(
                ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", probe],
                capture_output=True,
                text=True,
                timeout=30,
                cwd="/",
                env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")},
            )
            assert other.returncode == 3 and "PoolUnavailable" in other.stdout, (other.stdout, other.stderr)
        client = pool.client
        workers = pool.worker_pids()
        assert len(workers) == 2
        result: list[JobResult] = []
        code = (
            "import subprocess, time\np = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
            "print('child', p.pid, flush=True)\ntime.sleep(60)"
        )
        out: list[str] = []
        t = threading.Thread(target=lambda: result.append(client.run_code(code, on_output=lambda s, x: out.append(x))))
        t.start()
        wait_for(lambda: "child" in "".join(out), timeout=10)
        child = int("".join(out).split()[1])
        assert pool.proc is not None
        pool.proc.terminate()
        assert pool.proc.wait(15) == 0
        t.join(10)
        assert result and result[0].status == "cancelled" and "shutting down" in (result[0].error or "")
        for pid in [*workers, child]:
            wait_for(lambda pid=pid: not alive(pid), timeout=5)  # type: ignore[misc]
        assert not sock.exists()
        wait_for(lambda: not any(s["pid"] in workers for g in arb.status()["gpus"] for s in g["sessions"]), timeout=5)
    finally:
        pool.stop()
        shutil.rmtree(open_dir, ignore_errors=True)


def _pools_serving(endpoint: str) -> list[int]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "krex_lab.workers.pool" in cmd and f"--endpoint={endpoint}" in cmd:
            found.append(p.pid)
    return found


def test_krex_run_starts_a_pool_on_demand_that_exits_when_idle(arb: ArbiterProc, tmp_path: Path) -> None:
    config = tmp_path / "jupyter-config"
    config.mkdir()
    (config / "krex_pool_config.json").write_text(json.dumps({"Pool": {"preload": [], "spares_per_gpu": 0}}))
    endpoint = f"ipc://{arb.runtime / 'ondemand.sock'}"
    env = {**arb.env(), "KREX_POOL_ENDPOINT": endpoint, "KREX_POOL_IDLE_EXIT": "4", "JUPYTER_CONFIG_DIR": str(config)}
    script = tmp_path / "hello.py"
    script.write_text("import os\nprint('hello from', os.environ['KREX_WORKER'])\n")
    assert not _pools_serving(endpoint)
    # Three at once with no pool: each finds none, one pool wins, all three run.
    with_env = [
        subprocess.Popen(
            [sys.executable, "-m", "krex_lab.cli", "run", str(script)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=60) for p in with_env]
    assert [p.returncode for p in with_env] == [0, 0, 0]
    assert [out for out, _ in outputs] == ["hello from 1\n"] * 3
    wait_for(lambda: len(_pools_serving(endpoint)) == 1, timeout=10)
    status = PoolClient.connect(endpoint, start=False).status()
    assert status.pool.on_demand is True and status.pool.preload == []
    pool_pid = status.pool.pid
    # The one that started it says so, once, on stderr: where it runs, how long it stays, how to stop it.
    said = [line for _, err in outputs for line in err.splitlines() if "started a pool" in line]
    assert said == [
        f"krex: started a pool of warm workers in the background (pid {pool_pid}, log {arb.runtime / 'pool.log'}) "
        f"for this and later runs; it exits after 4 idle seconds, or stop it now with `kill {pool_pid}`"
    ], outputs
    workers = [w.pid for g in status.gpus for w in g.workers]
    again = krex_run(env, str(script))
    assert again.returncode == 0 and "started a pool" not in again.stderr  # still there between commands
    t0 = time.monotonic()
    wait_for(lambda: not alive(pool_pid), timeout=15)
    assert time.monotonic() - t0 > 1.0
    for pid in workers:
        wait_for(lambda pid=pid: not alive(pid), timeout=5)  # type: ignore[misc]
    said = [line for line in (arb.runtime / "pool.log").read_text().splitlines() if "exiting" in line]
    assert len(said) == 1 and "idle for 4 s" in said[0], said  # its log says why it exited


def test_tcp_endpoints_are_refused(arb: ArbiterProc) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "krex_lab.workers.pool", "--endpoint=tcp://127.0.0.1:45671", "--no-preload"],
        env=arb.env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1
    assert "refusing to serve tcp://127.0.0.1:45671" in r.stderr


def test_a_second_pool_says_who_serves_and_fails(arb: ArbiterProc, tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path / 'one.sock'}"
    first = PoolProc(arb.env(), endpoint, "--no-preload", "--spares=0", log=tmp_path / "first.log").start(timeout=90)
    try:
        assert first.proc is not None
        r = subprocess.run(
            [sys.executable, "-m", "krex_lab.workers.pool", f"--endpoint={endpoint}", "--no-preload"],
            env=arb.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1, r.stderr
        said = f"another pool (pid {first.proc.pid}) already serves {endpoint}"
        assert [line for line in r.stderr.splitlines() if said in line], r.stderr
        # a pool started on demand, or by a launcher that only needs one to serve, leaves quietly
        for flag in ("--on-demand", "--step-aside"):
            r = subprocess.run(
                [sys.executable, "-m", "krex_lab.workers.pool", f"--endpoint={endpoint}", "--no-preload", flag],
                env=arb.env(),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert r.returncode == 0 and "ERROR" not in r.stderr, (flag, r.stderr)
    finally:
        first.stop()


def test_workers_register_again_when_the_arbiter_restarts(arb: ArbiterProc) -> None:
    pool = PoolProc(
        arb.env(),
        f"ipc://{arb.runtime / 'restart.sock'}",
        "--no-preload",
        "--workers-per-gpu=1",
        "--spares=0",
        "--Pool.resync=0.3",
        log=arb.runtime / "restart.log",
    )
    pool.start()
    try:
        [first] = pool.worker_pids()
        assert first in {s["pid"] for g in arb.status()["gpus"] for s in g["sessions"]}
        arb.stop()
        arb.start()

        def registered_again() -> bool:
            pids = pool.worker_pids()
            sessions = {s["pid"] for g in arb.status()["gpus"] for s in g["sessions"]}
            return bool(pids) and first not in pids and set(pids) <= sessions

        wait_for(registered_again, timeout=15, interval=0.1)
        r = pool.client.run_code("1", exclusive=True)  # needs a session the new arbiter knows
        assert r.ok and r.region is not None and r.region["holder_pid"] == r.worker_pid, r
    finally:
        pool.stop()
