"""The candidate's sandbox on a real NVIDIA GPU: the spare locks itself before its CUDA context
exists, yet the context, CUDA IPC with the judge, a load_inline build (ninja, nvcc, the host
compiler, in the build directory), Triton's JIT and numba still work; and the attacks a GPU
container's root can make on its judge are still denied there."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from krex_lab.evaluate import Evaluation, evaluate
from tests.evaluate.helpers import SCALED_ADD_MODEL
from tests.gpu.helpers import nvidia_pool
from tests.gpu.test_evaluate_gpu import REFERENCE, cuda_candidate
from tests.support import ROOT
from tests.support.pool import PoolProc

pytestmark = pytest.mark.gpu

LIMITS = {"load": 600.0, "check": 30.0, "time": 60.0}
PROBLEMS = ROOT / "benchmarks" / "eval_problems"

PROC_MEM = (
    """
import os
import torch
from torch import nn

zygote = os.getppid()
with open(f"/proc/{zygote}/stat") as f:
    judge = int(f.read().rsplit(")", 1)[1].split()[1])
with open(f"/proc/{judge}/maps") as maps, open(f"/proc/{judge}/mem", "rb", 0) as mem:
    mem.seek(int(next(ln for ln in maps if " rw" in ln).split("-")[0], 16))
    mem.read(4096)
"""
    + SCALED_ADD_MODEL
)


@pytest.fixture(scope="module")
def gpu_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolProc]:
    yield from nvidia_pool(tmp_path_factory, "--Pool.preload=torch", "--workers-per-gpu=2", "--spares=1")


def run(pool: PoolProc, reference: object, candidate: object) -> Evaluation:
    return evaluate(reference, candidate, pool=pool.client, gpu=0, timeouts=LIMITS)  # type: ignore[arg-type]


def held(ev: Evaluation) -> str:
    said = str(ev.metadata.get("sandbox", ""))
    assert said.startswith("held: no_new_privs, dumpable, capabilities, seccomp"), said
    return said


def test_a_load_inline_build_runs_and_is_timed_inside_the_sandbox(gpu_pool: PoolProc) -> None:
    ev = run(gpu_pool, REFERENCE, cuda_candidate("krex_sandboxed_add", "if (i < n) out[i] = alpha * a[i] + b[i];"))
    assert ev.verdict == "correct", ev.summary + str(ev.metadata)
    assert ev.gpu_timed
    print("sandbox:", held(ev), "| load phase", ev.phases.get("load"), "s")


@pytest.mark.parametrize("kind", ["triton", "numba"])
def test_a_jit_compiled_candidate_runs_inside_the_sandbox(gpu_pool: PoolProc, kind: str) -> None:
    if kind == "triton":
        pytest.importorskip("triton")
        ref, cand = PROBLEMS / "06_vector_add" / "reference.py", PROBLEMS / "06_vector_add" / "new_triton.py"
    else:
        pytest.importorskip("numba")
        ref, cand = PROBLEMS / "06_vector_add" / "reference.py", PROBLEMS / "06_vector_add" / "new_numba.py"
    ev = run(gpu_pool, ref, cand)
    assert ev.verdict == "correct", ev.summary + str(ev.metadata)
    held(ev)


def test_reading_the_judges_memory_is_denied_on_a_gpu_worker(gpu_pool: PoolProc) -> None:
    ev = run(gpu_pool, REFERENCE, PROC_MEM)
    assert ev.verdict == "runtime_error", ev.summary
    assert "Permission denied" in str(ev.metadata.get("runtime_error")), ev.metadata
    held(ev)


DEV_SHM = """
import os
import torch
from torch import nn

with open("/dev/shm/{token}", "wb") as f:  # memory no limit counts, left after the candidate
    f.write(b"x" * (1 << 20))


class ModelNew(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        return torch.add(b, a, alpha=self.alpha)
"""


def test_a_candidate_on_a_gpu_opens_the_judges_ipc_counters_but_makes_no_file_in_dev_shm(gpu_pool: PoolProc) -> None:
    """The candidate's side opens torch's CUDA IPC counters in /dev/shm (every input crosses so):
    an honest candidate is correct; one that makes a file there is refused, and none is left."""
    token = f"krex-gpu-attack-{secrets.token_hex(6)}"
    try:
        ev = run(gpu_pool, REFERENCE, DEV_SHM.format(token=token))
        assert not Path("/dev/shm", token).exists(), ev.summary
        assert ev.verdict == "runtime_error" and "Permission denied" in str(ev.metadata.get("runtime_error")), (
            ev.summary
        )
        honest = run(gpu_pool, REFERENCE, DEV_SHM.replace('with open("/dev/shm/{token}", "wb") as f:', "if False:"))
        assert honest.verdict == "correct", honest.summary + str(honest.metadata)
        held(honest)
    finally:
        Path("/dev/shm", token).unlink(missing_ok=True)


def test_a_cuda_build_is_found_again_by_the_next_evaluation_of_its_source(gpu_pool: PoolProc) -> None:
    """Each evaluation's build directory is its own (emptied before, removed after), yet what
    nvcc and ninja made while the candidate loaded is kept for the same source: the second
    evaluation builds nothing."""
    source = cuda_candidate(f"krex_kept_{secrets.token_hex(4)}", "if (i < n) out[i] = alpha * a[i] + b[i];")
    first = run(gpu_pool, REFERENCE, source)
    second = run(gpu_pool, REFERENCE, source)
    assert first.verdict == second.verdict == "correct", (first.summary, second.summary)
    print("load phase: first", first.phases.get("load"), "s, second", second.phases.get("load"), "s")
    assert second.phases["load"] < first.phases["load"] / 5, (first.phases, second.phases)
