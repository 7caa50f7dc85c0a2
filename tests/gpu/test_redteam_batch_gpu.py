"""One GPU cheat of each kind inside one batch of 16 evaluations at once on one GPU, beside honest
candidates (tests/evaluate/redteam/batch.py): no forged verdict against the honest candidates of
the same batch, and every honest candidate ``correct`` within noise of the others. 16 workers share
the GPU, as ``benchmarks/eval/eval_batch.py --jobs 16`` runs them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.evaluate.redteam import GPU_CHEATS
from tests.evaluate.redteam.batch import judge_batch
from tests.gpu.helpers import nvidia_pool
from tests.support.pool import PoolProc

pytestmark = pytest.mark.gpu

LIMITS = {"load": 600.0, "check": 120.0, "time": 300.0}
#: one cheat of each kind (tests/evaluate/redteam/gpu/<name>.py)
BATCH_CHEATS = [
    "gpu_side_stream",  # work on a stream the event pair misses
    "gpu_event_elapsed_time",  # the event timer patched
    "gpu_lazy_tensor_clone_proxy",  # lazy output, worked when the reply reads it
    "gpu_reply_patch_harness",  # the candidate's own reply path rewritten
    "gpu_thread_after_return",  # a background thread launches the work after the call
    "gpu_finalizer_next_round",  # the next round launched by a finalizer
    "gpu_cuda_graph_replay",  # a CUDA graph replayed on stale inputs
    "gpu_zeroed_inputs_timed",  # zeroed inputs
    "gpu_empty_reference_output",  # empty() holding a freed output
    "gpu_l2_persisting_window",  # a persisting-L2 access window
]
HONEST = {"gpu_kb_mm_tanh": 6}
JOBS = 16


@pytest.fixture(scope="module")
def gpu_batch_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolProc]:
    yield from nvidia_pool(
        tmp_path_factory,
        "--Pool.preload=torch",
        f"--workers-per-gpu={JOBS}",
        "--spares=0",
        "--Pool.interrupt_grace=2.0",
    )


@pytest.mark.timeout(1800)
def test_gpu_cheats_in_a_batch_beside_honest_candidates(gpu_batch_pool: PoolProc) -> None:
    by_name = {c.name: c for c in GPU_CHEATS}
    cheats = [by_name[n] for n in BATCH_CHEATS]
    assert len(cheats) + sum(HONEST.values()) == JOBS
    outcome = judge_batch(cheats, HONEST, gpu_batch_pool, JOBS, timeouts=LIMITS, gpu=0)
    assert not outcome.found, "\n".join(outcome.found) + "\n" + outcome.table()
