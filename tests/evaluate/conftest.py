"""One real arbiter (fake backend, one GPU) and one real pool of torch-warm workers for the
evaluate tests; ``evaluate(problem, candidate)`` runs the whole path against them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from krex_lab.evaluate import Evaluation, evaluate
from krex_lab.pytest_plugin import ArbiterProc, running_arbiter
from tests.support.pool import PoolProc

from .helpers import LIMITS, problem


@pytest.fixture(scope="package")
def eval_arbiter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArbiterProc]:
    base = tmp_path_factory.mktemp("eval-arb")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KREX_POOL_ENDPOINT", f"ipc://{base / 'rt' / 'pool.sock'}")
        mp.setenv("KREX_EVAL_CACHE", str(base / "cache"))
        yield from running_arbiter(base, mp, gpus=1)


@pytest.fixture(scope="package")
def eval_pool(eval_arbiter: ArbiterProc) -> Iterator[PoolProc]:
    pool = PoolProc(
        eval_arbiter.env(),
        f"ipc://{eval_arbiter.runtime / 'pool.sock'}",
        "--Pool.preload=torch",
        "--workers-per-gpu=2",
        "--spares=1",
        "--Pool.interrupt_grace=1.0",
        "--debug",
        log=eval_arbiter.runtime / "pool.log",
    )
    pool.start(120)
    yield pool
    pool.stop()


@pytest.fixture
def run(eval_pool: PoolProc) -> Callable[..., Evaluation]:
    """``run("kb_softmax", "correct.py", **options)``: the evaluation of that candidate."""

    def go(name: str, candidate: str, **options: Any) -> Evaluation:
        options.setdefault("timeouts", LIMITS)
        return evaluate(problem(name), problem(name, candidate), pool=eval_pool.client, **options)

    return go
