"""One cheat of each kind inside one batch of 16 evaluations submitted at once, beside honest
candidates, on the fake backend: no cheat gets a forged verdict against the honest candidates of
its problem in the same batch, and every honest candidate is ``correct`` within noise of the
others (a cheat that slows its judge, or its neighbours, shows there). The pool is private (a
cheat of the batch may leave its worker changed for good) and small: 2 fake GPUs, 4 workers each,
on a 2-core CI machine; the batch queues what the workers cannot run at once."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from krex_lab.pytest_plugin import ArbiterProc, running_arbiter
from tests.evaluate.redteam import APART, CHEATS
from tests.evaluate.redteam.batch import judge_batch
from tests.support.pool import PoolProc

#: one cheat of each kind, by the mechanism it uses (tests/evaluate/redteam/<name>.py)
BATCH_CHEATS = [
    "lazy_tensor_clone_proxy",  # lazy output, worked when the reply reads it
    "reply_patch_harness",  # the candidate's own reply path rewritten
    "reply_fd_relay",  # the channel's fd taken over, samples forged
    "seed_judge_proc_mem",  # the judge's seeds read from its memory
    "judge_renice_spin",  # the judge reniced, a spinning thread beside it
    "input_write_timed",  # the answer written into the input in timed calls
    "finalizer_next_round",  # the next round computed by a finalizer
    "child_fork_slow_clock",  # a child does the work, the clock slowed
    "batch_round_storage",  # a round answered from its first call, through the shared storage
    "near_constant_tiny",  # a near-constant output on a tiny-output problem
]
HONEST = {"kb_mm_tanh": 5, "kb_tiny_out": 1}
JOBS = 16
#: eight evaluations at once share two cores: each phase's limit well above what it takes alone
LIMITS = {"load": 300.0, "check": 120.0, "time": 120.0}


@pytest.fixture(scope="module")
def batch_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolProc]:
    base = tmp_path_factory.mktemp("redteam-batch")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KREX_POOL_ENDPOINT", f"ipc://{base / 'rt' / 'pool.sock'}")
        mp.setenv("KREX_EVAL_CACHE", str(base / "cache"))
        arbiter: ArbiterProc
        for arbiter in running_arbiter(base, mp, gpus=2):
            pool = PoolProc(
                arbiter.env(),
                f"ipc://{arbiter.runtime / 'pool.sock'}",
                "--Pool.preload=torch",
                "--workers-per-gpu=4",
                "--spares=0",
                "--Pool.interrupt_grace=1.0",
                log=arbiter.runtime / "pool.log",
            )
            pool.start(300)
            try:
                yield pool
            finally:
                pool.stop()


@pytest.mark.timeout(1200)
def test_cheats_in_a_batch_beside_honest_candidates(batch_pool: PoolProc) -> None:
    by_name = {c.name: c for c in CHEATS}
    cheats = [by_name[n] for n in BATCH_CHEATS]
    assert len(cheats) + sum(HONEST.values()) == JOBS
    outcome = judge_batch(cheats, HONEST, batch_pool, JOBS, timeouts=LIMITS, perf_trials=30)
    assert not outcome.found, "\n".join(outcome.found) + "\n" + outcome.table()


#: two copies of one cheat that collude (tests/evaluate/redteam/collude_dev_shm.py), on its problem
COLLUDE, COLLUDE_PROBLEM = "collude_dev_shm", "kb_outer_tanh"


@pytest.mark.timeout(600)
def test_two_candidates_colluding_across_gpus(batch_pool: PoolProc) -> None:
    """Two copies of the colluding cheat and two honest candidates of its problem in one batch: the
    pairs go to both GPUs, and a CPU-timed case holds both GPUs' regions, so the co-processor is
    frozen while its client is timed (the client's calls then compute their own answers)."""
    cheat = next(c for c in APART if c.name == COLLUDE)
    copies = [replace(cheat, name=f"{COLLUDE}-{k}", file=COLLUDE) for k in (1, 2)]
    outcome = judge_batch(copies, {COLLUDE_PROBLEM: 2}, batch_pool, 4, timeouts=LIMITS, perf_trials=30)
    if outcome.found and all("reference time" in f for f in outcome.found):
        # a host-clock reference of about a millisecond read 3.5x its peers' once on a loaded 2-core
        # machine, and never again alone: a reference the cheat slows reads so every time
        first = "\n".join(outcome.found)
        outcome = judge_batch(copies, {COLLUDE_PROBLEM: 2}, batch_pool, 4, timeouts=LIMITS, perf_trials=30)
        assert not outcome.found, f"twice:\n{first}\n" + "\n".join(outcome.found) + "\n" + outcome.table()
    assert not outcome.found, "\n".join(outcome.found) + "\n" + outcome.table()
