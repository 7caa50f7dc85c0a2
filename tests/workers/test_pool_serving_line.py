"""``krex pool`` in the foreground says where it serves: one INFO line at its default log level
(the arbiter it follows, or that none answers yet), while the rest of its log stays quiet."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from krex_lab import __version__
from krex_lab.pytest_plugin import ArbiterProc, running_arbiter, subprocess_pythonpath
from tests.support.pool import PoolProc

pytestmark = pytest.mark.timeout(120)

QUICK = ("--workers-per-gpu=1", "--spares=0", "--no-preload")


@pytest.fixture(scope="module")
def arb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArbiterProc]:
    with pytest.MonkeyPatch.context() as mp:
        yield from running_arbiter(tmp_path_factory.mktemp("arb"), mp, gpus=2)


def _serving_lines(pool: PoolProc) -> list[str]:
    return [line for line in pool.log().splitlines() if "serving on" in line]


def test_the_pool_says_where_it_serves_and_which_arbiter_it_follows(arb: ArbiterProc) -> None:
    endpoint = f"ipc://{arb.runtime / 'line.sock'}"
    pool = PoolProc(arb.env(), endpoint, *QUICK, log=arb.runtime / "line.log").start()
    try:
        lines = _serving_lines(pool)
        assert len(lines) == 1, pool.log()
        assert f"krex pool {__version__} serving on {endpoint} (GPUs [0, 1], arbiter {arb.endpoint};" in lines[0]
        assert " INFO " in lines[0]
        # Not chatty otherwise: the workers' start-up lines (INFO) stay out at the default level.
        assert "ready in" not in pool.log()
    finally:
        pool.stop()
    # and why it stopped, for whoever finds it gone (a lab's log shows only its exit status)
    said = pool.log().splitlines()
    assert any("SIGTERM received: stopping" in line for line in said), pool.log()
    assert said[-1].endswith("krex pool stopped"), pool.log()


def test_the_pool_says_when_no_arbiter_answers(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {
        **os.environ,
        "KREX_RUNTIME_DIR": str(runtime),
        "KREX_ENDPOINT": f"ipc://{runtime / 'nobody.sock'}",
        "PYTHONPATH": subprocess_pythonpath(),
    }
    endpoint = f"ipc://{runtime / 'pool.sock'}"
    pool = PoolProc(env, endpoint, *QUICK, "--Pool.fallback_gpus=1", log=tmp_path / "pool.log").start()
    try:
        lines = _serving_lines(pool)
        assert len(lines) == 1, pool.log()
        assert f"serving on {endpoint} (GPUs [0], arbiter none answers yet;" in lines[0]
    finally:
        pool.stop()


def test_a_quieter_log_level_hides_it(arb: ArbiterProc) -> None:
    endpoint = f"ipc://{arb.runtime / 'quiet.sock'}"
    pool = PoolProc(arb.env(), endpoint, *QUICK, "--log-level=ERROR", log=arb.runtime / "quiet.log").start()
    try:
        assert _serving_lines(pool) == [], pool.log()
    finally:
        pool.stop()
