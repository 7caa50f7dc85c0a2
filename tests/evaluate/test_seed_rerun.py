"""A seed given for a reproducible run does not make the timed inputs predictable: a candidate run
again under the same seed, with answers it left in its build directory the first time
(``redteam/cache_in_build_dir.py``), must do the work again."""

from __future__ import annotations

from pathlib import Path

from krex_lab.evaluate import evaluate
from tests.support.pool import PoolProc

HERE = Path(__file__).parent / "redteam"
REFERENCE = HERE / "problems" / "kb_mm_tanh" / "reference.py"
LIMITS = {"load": 120.0, "check": 120.0, "time": 120.0}


def test_a_rerun_under_the_same_seed_meets_new_timed_inputs(eval_pool: PoolProc) -> None:
    runs = [
        evaluate(REFERENCE, HERE / "cache_in_build_dir.py", pool=eval_pool.client, seed=7, timeouts=LIMITS)
        for _ in range(2)
    ]
    honest = evaluate(REFERENCE, REFERENCE.parent / "honest.py", pool=eval_pool.client, seed=7, timeouts=LIMITS)
    assert honest.verdict == "correct" and honest.speedup is not None, honest.summary
    _, again = runs
    assert again.verdict in ("correct", "runtime_error", "rejected"), again.summary
    if again.verdict == "correct":  # the answers from the first run must not be timed as work
        assert again.speedup is not None and again.speedup < 1.5 * honest.speedup, (again.summary, honest.summary)
