"""``krex run --gpu N`` on a pool started before the node's arbiter (no arbiter then: the one GPU
it found alone) makes a pool serve GPU N: the pool's own resync is waited for when the arbiter is
the one it watches, and an idle pool started on demand that can never find it (the arbiter is
elsewhere) is replaced. The old refusal, "GPU 1 is not served by this pool (GPUs [0])", said
nothing the user could do but restart it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from krex_lab.pytest_plugin import ArbiterProc, wait_for
from krex_lab.workers.client import PoolClient
from tests.support import ROOT


def _krex_run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "run", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def lone_pool(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """A pool that ``krex run`` started on demand with no arbiter anywhere (one fake GPU); every
    pool serving its endpoint is ended after."""
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k not in ("KREX_ENDPOINT", "KREX_POOL_ENDPOINT")}
    env |= {"KREX_RUNTIME_DIR": str(runtime), "KREX_NODE_ENDPOINT": "", "PYTHONPATH": str(ROOT)}
    # the pools started on demand preload nothing and keep no spare: what is tested is which GPUs
    # they serve (each import of torch costs seconds on a small machine)
    config = tmp_path / "jupyter-config"
    config.mkdir()
    (config / "krex_pool_config.json").write_text('{"Pool": {"preload": [], "spares_per_gpu": 0}}')
    env["JUPYTER_CONFIG_PATH"] = str(config)
    script = tmp_path / "where.py"
    script.write_text("import os\nprint('gpu', os.environ['KREX_GPU'])\n")
    first = _krex_run(env, str(script))
    assert first.returncode == 0 and first.stdout == "gpu 0\n", first.stderr
    endpoint = f"ipc://{runtime / 'pool.sock'}"
    with PoolClient.connect(endpoint, start=False) as c:
        assert c.info is not None
        if c.info.gpus != [0]:
            pytest.skip(f"this machine's pool found GPUs {c.info.gpus} without an arbiter, not one")
    yield env, script
    try:
        c = PoolClient.connect(endpoint, start=False)
    except Exception:
        return
    with c:
        assert c.info is not None
        os.kill(c.info.pid, signal.SIGTERM)
        wait_for(lambda: not os.path.exists(f"/proc/{c.info.pid}"), timeout=20)  # type: ignore[union-attr]


def _pool_pid(env: dict[str, str]) -> int:
    with PoolClient.connect(f"ipc://{env['KREX_RUNTIME_DIR']}/pool.sock", start=False) as c:
        assert c.info is not None
        return c.info.pid


def test_an_arbiter_started_where_the_pool_looks_is_waited_for(lone_pool: tuple[dict[str, str], Path]) -> None:
    env, script = lone_pool
    before = _pool_pid(env)
    arb = ArbiterProc(Path(env["KREX_RUNTIME_DIR"]), gpus=2).start()
    try:
        r = _krex_run(env, "--gpu", "1", str(script))  # at once: before the pool's resync found it
        assert r.returncode == 0 and r.stdout == "gpu 1\n", r.stderr
        assert "not served" not in r.stderr and "replaced" not in r.stderr, r.stderr
        assert _pool_pid(env) == before  # the same pool, now the arbiter's
    finally:
        arb.stop()


def test_an_idle_pool_that_cannot_find_the_arbiter_is_replaced(
    lone_pool: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    env, script = lone_pool
    before = _pool_pid(env)
    elsewhere = tmp_path / "node"
    elsewhere.mkdir(mode=0o700)
    arb = ArbiterProc(elsewhere, gpus=2).start()  # the node's arbiter: not where the pool looks
    try:
        env = {**env, "KREX_ENDPOINT": arb.endpoint}
        r = _krex_run(env, "--gpu", "1", str(script))
        assert r.returncode == 0 and r.stdout == "gpu 1\n", r.stderr
        assert f"the pool (pid {before}) serves GPUs [0], not the GPUs [0, 1]" in r.stderr, r.stderr
        assert "restart" not in r.stderr, r.stderr
        assert not os.path.exists(f"/proc/{before}") and _pool_pid(env) != before
        # a GPU the node does not have is refused, saying what the node has
        r = _krex_run(env, "--gpu", "5", str(script))
        assert r.returncode == 2 and r.stdout == "", r.stderr
        assert f"GPU 5 is not on this node (the arbiter at {arb.endpoint} has GPUs [0, 1])" in r.stderr, r.stderr
    finally:
        arb.stop()
