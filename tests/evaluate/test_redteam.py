"""The red-team corpus (tests/evaluate/redteam/) on the CPU: each cheat, evaluated on the whole
path, gets no forged verdict, and its honest twin (the same source with ``CHEAT = False``) is
``correct`` at the plain honest candidate's speed. What each cheat is checked for is said in the
corpus's module doc; cheats that change a process for good run last. With ``KREX_REDTEAM_LOG``
set to a file, each cheat judged adds a JSON line to it (its verdict and times beside its twin's,
what was forged), whether or not its test passes."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from tests.evaluate.helpers import LIMITS
from tests.evaluate.redteam import CHEATS, Cheat
from tests.evaluate.redteam.harness import Baselines, clean_up, judge_cheat, make_judge, summary
from tests.support.pool import PoolProc

#: KernelBench's timed calls: fewer than its 100, enough for a mean on a 2-core machine
PERF_TRIALS = 30
ORDERED = [c for c in CHEATS if not c.lasting] + [c for c in CHEATS if c.lasting]


@pytest.fixture(scope="module")
def baselines() -> Baselines:
    return Baselines()


@pytest.fixture(autouse=True)
def _remove_what_cheats_leave(eval_pool: PoolProc) -> Iterator[None]:
    yield
    clean_up(eval_pool.env.get("PYTHONPATH", ""))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("cheat", ORDERED, ids=[c.name for c in ORDERED])
def test_cheat_gets_no_forged_verdict(cheat: Cheat, eval_pool: PoolProc, baselines: Baselines) -> None:
    judge = make_judge(eval_pool, LIMITS, perf_trials=PERF_TRIALS)
    rec = judge_cheat(cheat, judge, eval_pool, baselines, LIMITS)
    if log := os.environ.get("KREX_REDTEAM_LOG"):
        with open(log, "a") as f:
            f.write(json.dumps(summary(rec)) + "\n")
    assert not rec.found, f"{cheat.name} ({cheat.kind}): {rec.ev.summary}\n" + "\n".join(rec.found)
