"""Evaluations at once, each timing in regions: none of KREX's own processes is found stopped.

Two judges on one (fake) GPU, each with its zygote and spares: a region of one stops the other's
whole tree, and its thaw must leave nothing stopped (a region finding one of them stopped could
not lock it on a real GPU, and was degraded). Every region's report is clean (nothing skipped as
already stopped, nothing degraded for a stopped process), and once the batch is over no process of the pool is stopped.
The lock path's own case (a process the region stopped whose context shows only later) is
``tests/arbiter/test_frozen_newcomer.py``.
"""

from __future__ import annotations

import concurrent.futures

from krex_lab.evaluate import Evaluation, evaluate
from krex_lab.procutil import STOPPED, proc_state, tree
from tests.support.pool import PoolProc

from .helpers import LIMITS, problem

PAIRS = [("kb_scaled_add", "correct.py"), ("kb_add3", "correct.py"), ("gm_vector_scale", "correct.py")] * 2


def test_concurrent_evaluations_leave_nothing_stopped_and_no_region_degraded(eval_pool: PoolProc) -> None:
    def one(pair: tuple[str, str]) -> Evaluation:
        return evaluate(problem(pair[0]), problem(*pair), pool=eval_pool.client, timeouts=LIMITS)

    with concurrent.futures.ThreadPoolExecutor(len(PAIRS)) as ex:
        evaluations = list(ex.map(one, PAIRS))
    assert [ev.verdict for ev in evaluations] == ["correct"] * len(PAIRS), [ev.summary for ev in evaluations]
    regions = [part.region for ev in evaluations for part in ev.regions if part.region is not None]
    assert len(regions) >= len(PAIRS)
    for report in regions:
        stopped = [why for why in report.why_degraded() if "stopped" in why]
        assert report.skipped_stopped == [] and stopped == [], report.skipped_stopped or stopped
    assert eval_pool.proc is not None
    stopped = [p for p in tree(eval_pool.proc.pid) if proc_state(p) in STOPPED]
    assert stopped == [], f"left stopped: {stopped}"
