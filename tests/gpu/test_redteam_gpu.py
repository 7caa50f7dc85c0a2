"""The red-team corpus's GPU-only cheats (tests/evaluate/redteam/gpu/: CUDA event patches, side
streams, kernels left running, stale device memory, CUDA IPC) on a real NVIDIA GPU, judged as the
CPU corpus is (tests/evaluate/test_redteam.py): no forged verdict, and an honest twin that is
correct at the plain honest candidate's speed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.evaluate.redteam import GPU_CHEATS, Cheat
from tests.evaluate.redteam.harness import Baselines, clean_up, judge_cheat, make_judge
from tests.gpu.helpers import nvidia_pool
from tests.support.pool import PoolProc

pytestmark = pytest.mark.gpu

LIMITS = {"load": 600.0, "check": 60.0, "time": 120.0}
ORDERED = [c for c in GPU_CHEATS if not c.lasting] + [c for c in GPU_CHEATS if c.lasting]


@pytest.fixture(scope="module")
def gpu_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolProc]:
    yield from nvidia_pool(
        tmp_path_factory, "--Pool.preload=torch", "--workers-per-gpu=2", "--spares=1", "--Pool.interrupt_grace=2.0"
    )


@pytest.fixture(scope="module")
def baselines() -> Baselines:
    return Baselines()


@pytest.fixture(autouse=True)
def _remove_what_cheats_leave(gpu_pool: PoolProc) -> Iterator[None]:
    yield
    clean_up(gpu_pool.env.get("PYTHONPATH", ""))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("cheat", ORDERED, ids=[c.name for c in ORDERED])
def test_gpu_cheat_gets_no_forged_verdict(cheat: Cheat, gpu_pool: PoolProc, baselines: Baselines) -> None:
    judge = make_judge(gpu_pool, LIMITS, gpu=0)
    rec = judge_cheat(cheat, judge, gpu_pool, baselines, LIMITS)
    assert not rec.found, f"{cheat.name} ({cheat.kind}): {rec.ev.summary}\n" + "\n".join(rec.found)
