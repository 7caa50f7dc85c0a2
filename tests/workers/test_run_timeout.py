"""``krex run --timeout``: exit 124 and one line, nothing else, on a worker that keeps an
evaluation's zygote (a worker that preloads torch): the job's interrupt is the job's alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from krex_lab.pytest_plugin import ArbiterProc, running_arbiter
from tests.support.pool import PoolProc, krex_run

ZYGOTE = "krex_lab.evaluate.candidate.zygote"


@pytest.fixture(scope="module")
def arb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArbiterProc]:
    with pytest.MonkeyPatch.context() as mp:
        yield from running_arbiter(tmp_path_factory.mktemp("arb"), mp, gpus=1)


@pytest.fixture(scope="module")
def torch_pool(arb: ArbiterProc) -> Iterator[PoolProc]:
    pytest.importorskip("torch")
    proc = PoolProc(
        arb.env(),
        f"ipc://{arb.runtime / 'timeout.sock'}",
        "--preload=torch",
        "--workers-per-gpu=1",
        "--spares=0",
        log=arb.runtime / "timeout.log",
    )
    proc.start(timeout=180)
    yield proc
    proc.stop()


def zygotes(pool: PoolProc) -> list[int]:
    assert pool.proc is not None
    found = []
    for p in psutil.Process(pool.proc.pid).children(recursive=True):
        try:
            if any(ZYGOTE in part for part in p.cmdline()):
                found.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return found


def test_a_timed_out_run_prints_its_one_line_and_nothing_else(
    arb: ArbiterProc, torch_pool: PoolProc, tmp_path: Path
) -> None:
    """The interrupt that ends a timed-out job went to the worker's whole process group, the
    zygote too: it died of a KeyboardInterrupt, its traceback streaming into the job's stderr (a
    lone ``Traceback (most recent call last):`` when the client ended first)."""
    before = zygotes(torch_pool)
    assert before, torch_pool.log()
    script = tmp_path / "sleeps.py"
    script.write_text("import time\ntime.sleep(60)\n")
    env = {**arb.env(), "KREX_POOL_ENDPOINT": torch_pool.endpoint}
    for _ in range(3):
        out = krex_run(env, "--timeout", "0.5", str(script), cwd=tmp_path)
        assert out.returncode == 124, out.stderr
        assert out.stderr == "krex run: timed out after 0.5 s\n" and out.stdout == "", out.stderr
        assert zygotes(torch_pool) == before, "the job's interrupt reached the worker's zygote"
