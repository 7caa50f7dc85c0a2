"""The red-team corpus (tests/evaluate/redteam/) on the CPU: each cheat, evaluated on the whole
path, gets no forged verdict, and its honest twin (the same source with ``CHEAT = False``) is
``correct`` at the plain honest candidate's speed. What each cheat is checked for is said in the
corpus's module doc; cheats that change a process for good run last. With ``KREX_REDTEAM_LOG``
set to a file, each cheat judged adds a JSON line to it (its verdict and times beside its twin's,
what was forged), whether or not its test passes.

Cheats whose only check is their own verdict, and that change nothing for later evaluations, are
judged two at a time on the pool's two workers (once, for all of them, at the first one's test):
the corpus's time in CI is then about what its sequential cheats take."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed

import pytest

from tests.evaluate.helpers import LIMITS
from tests.evaluate.redteam import CHEATS, Cheat
from tests.evaluate.redteam.harness import (
    Baselines,
    Record,
    clean_up,
    judge_cheat,
    make_judge,
    recycle_workers,
    summary,
)
from tests.support.pool import PoolProc

#: KernelBench's timed calls: fewer than its 100, enough for a mean on a 2-core machine
PERF_TRIALS = 30
ORDERED = [c for c in CHEATS if not c.lasting] + [c for c in CHEATS if c.lasting]
#: judged two at a time before their tests (see the module doc); the rest one at a time, in order
SHARED = {c.name for c in ORDERED if c.checks == ("speed",) and not c.lasting and not c.retime}
#: the evaluation pool's workers (tests/evaluate/conftest.py: one fake GPU, two workers)
WORKERS = 2


@pytest.fixture(scope="module")
def baselines() -> Baselines:
    return Baselines()


def _log(rec: Record) -> None:
    if log := os.environ.get("KREX_REDTEAM_LOG"):
        with open(log, "a") as f:
            f.write(json.dumps(summary(rec)) + "\n")


@pytest.fixture(scope="module")
def judged(request: pytest.FixtureRequest, eval_pool: PoolProc, baselines: Baselines) -> dict[str, Record | Exception]:
    """The shared cheats this session selected, judged two at a time: name -> record (or what
    judging it raised: a twin that was not correct, say)."""
    chosen = [
        c
        for item in request.session.items
        if (c := getattr(getattr(item, "callspec", None), "params", {}).get("cheat")) is not None
        and isinstance(c, Cheat)
        and c.name in SHARED
    ]
    judge = make_judge(eval_pool, LIMITS, perf_trials=PERF_TRIALS)
    for problem in sorted({c.problem for c in chosen}):  # the plain baselines first, alone
        baselines.get(judge, problem, "honest")
    out: dict[str, Record | Exception] = {}
    try:
        with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="redteam") as ex:
            futures = {ex.submit(judge_cheat, c, judge, eval_pool, baselines, LIMITS): c for c in chosen}
            for future in as_completed(futures):
                name = futures[future].name
                try:
                    out[name] = rec = future.result()
                    _log(rec)
                except Exception as exc:
                    out[name] = exc
    finally:
        clean_up(eval_pool.env.get("PYTHONPATH", ""))
    return out


@pytest.fixture(autouse=True)
def _remove_what_cheats_leave(eval_pool: PoolProc) -> Iterator[None]:
    yield
    if clean_up(eval_pool.env.get("PYTHONPATH", "")):
        recycle_workers(eval_pool)  # workers started while a planted file was there ran it


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("cheat", ORDERED, ids=[c.name for c in ORDERED])
def test_cheat_gets_no_forged_verdict(
    cheat: Cheat, request: pytest.FixtureRequest, eval_pool: PoolProc, baselines: Baselines
) -> None:
    if cheat.name in SHARED:
        got = request.getfixturevalue("judged")[cheat.name]
        if isinstance(got, Exception):
            raise got
        rec = got
    else:
        judge = make_judge(eval_pool, LIMITS, perf_trials=PERF_TRIALS)
        rec = judge_cheat(cheat, judge, eval_pool, baselines, LIMITS)
        _log(rec)
    assert not rec.found, f"{cheat.name} ({cheat.kind}): {rec.ev.summary}\n" + "\n".join(rec.found)
