"""A lab that finds a pool already serving (one ``krex run`` started before any arbiter ran) uses
it only when it serves every GPU the lab places kernels on: the pool takes the arbiter's GPUs
once it finds it, and a pool that cannot (pinned to fewer) is replaced by the lab's own. Real
arbiter (fake backend, 2 GPUs), real pools, the extension's own ``Services``."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from krex_lab.pytest_plugin import ArbiterProc
from krex_lab.serverext.processes import Options, Services, pool_available
from tests.support.pool import PoolProc

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(not pool_available(), reason="needs the pool service")]


@pytest.fixture
def runtime(tmp_path: Path) -> Path:
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    return rt


def early_pool(runtime: Path, tmp_path: Path, *args: str) -> PoolProc:
    """A pool started while no arbiter answers: it assumes the one GPU it finds alone."""
    arbiter = f"ipc://{runtime / 'arbiter.sock'}"
    env = {**os.environ, "KREX_RUNTIME_DIR": str(runtime), "KREX_ENDPOINT": arbiter}
    pool = PoolProc(
        env,
        f"ipc://{runtime / 'pool.sock'}",
        "--no-preload",
        "--spares=0",
        "--Pool.arbiter_wait=0",
        "--Pool.fallback_gpus=1",
        *args,
        log=tmp_path / "early-pool.log",
    ).start(90)
    assert [g.index for g in pool.status().gpus] == [0]
    return pool


@pytest.fixture
def lab(runtime: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], Services]]:
    """``lab()``: the arbiter (2 GPUs) starts, then a lab's services on it (what `make lab` does)."""
    monkeypatch.setenv("KREX_RUNTIME_DIR", str(runtime))
    monkeypatch.delenv("KREX_POOL_ENDPOINT", raising=False)
    started: list[tuple[Services, ArbiterProc]] = []

    def start() -> Services:
        arbiter = ArbiterProc(runtime, gpus=2).start()
        options = Options(
            endpoint=arbiter.endpoint,
            embedded=False,
            node_endpoint="",
            runtime_dir=str(runtime),
            pool_args=["--no-preload", "--spares=0"],
        )
        svc = Services(options, logging.getLogger("krex.test-lab"))
        started.append((svc, arbiter))
        svc.start()
        return svc

    yield start
    for svc, arbiter in started:
        asyncio.run(svc.stop())
        arbiter.stop()


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "pool already serving" in r.getMessage()]


def test_a_pool_started_before_the_arbiter_serves_its_gpus_once_the_lab_uses_it(
    runtime: Path, tmp_path: Path, lab: Callable[[], Services], caplog: pytest.LogCaptureFixture
) -> None:
    early = early_pool(runtime, tmp_path)
    try:
        with caplog.at_level(logging.INFO, logger="krex.test-lab"):
            svc = lab()
        assert svc.pool is None, "the lab started a pool beside one that serves its GPUs"
        (line,) = said(caplog)
        assert "GPUs [0, 1]" in line and "it served GPUs [0]" in line, line
        # A job on GPU 1 runs: the pool serves it (it said "GPU 1 is not served by this pool").
        assert early.client.run_code("import os\nos.environ['KREX_GPU']", gpu=1).value == "'1'"
    finally:
        early.stop()


def test_a_pool_that_cannot_serve_the_labs_gpus_is_replaced_by_the_labs_own(
    runtime: Path, tmp_path: Path, lab: Callable[[], Services], caplog: pytest.LogCaptureFixture
) -> None:
    early = early_pool(runtime, tmp_path, "--Pool.gpus=[0]")  # pinned: it never serves GPU 1
    try:
        with caplog.at_level(logging.INFO, logger="krex.test-lab"):
            svc = lab()
        (line,) = said(caplog)
        assert "serves GPUs [0], not all of [0, 1]" in line and "starts a pool of its own" in line, line
        assert svc.pool is not None and svc.pool.alive() and svc.pool_endpoint != early.endpoint
        assert os.environ["KREX_POOL_ENDPOINT"] == svc.pool_endpoint, "kernels use the lab's pool"
        from krex_lab.workers.client import PoolClient

        ours = PoolClient.connect(svc.pool_endpoint, start=False)
        try:
            assert ours.info is not None and ours.info.gpus == [0, 1]
        finally:
            ours.close()
    finally:
        early.stop()
