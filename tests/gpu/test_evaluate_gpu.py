"""krex_lab.evaluate on a real NVIDIA GPU: a CUDA candidate built with load_inline and timed with
KernelBench's event pairs, and the hostile cases only a GPU has (a sticky illegal address, a
kernel that never ends, work on a side stream the event pair misses, device memory exhausted)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from krex_lab.evaluate import Evaluation, evaluate
from tests.gpu.helpers import nvidia_pool
from tests.support import ROOT
from tests.support.pool import PoolProc

pytestmark = pytest.mark.gpu

REFERENCE = ROOT / "tests" / "evaluate" / "problems" / "kb_scaled_add" / "reference.py"
LIMITS = {"load": 600.0, "check": 30.0, "time": 60.0}

CUDA_TEMPLATE = '''
import torch
from torch import nn
from torch.utils.cpp_extension import load_inline

CUDA = r"""
__global__ void scaled_add_kernel(const float* a, const float* b, float* out, float alpha, int n) {{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  {body}
}}
torch::Tensor scaled_add(torch::Tensor a, torch::Tensor b, double alpha) {{
  auto out = torch::empty_like(a);
  int n = a.numel();
  scaled_add_kernel<<<(n + 255) / 256, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(),
                                             (float)alpha, n);
  return out;
}}
"""
CPP = "torch::Tensor scaled_add(torch::Tensor a, torch::Tensor b, double alpha);"
ext = load_inline("{name}", cpp_sources=CPP, cuda_sources=CUDA, functions=["scaled_add"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        return ext.scaled_add(a, b, self.alpha)
'''


def cuda_candidate(name: str, body: str) -> str:
    return CUDA_TEMPLATE.format(name=name, body=body)


@pytest.fixture(scope="module")
def gpu_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolProc]:
    yield from nvidia_pool(
        tmp_path_factory, "--Pool.preload=torch", "--workers-per-gpu=2", "--spares=1", "--Pool.interrupt_grace=2.0"
    )


def run(pool: PoolProc, candidate: str, **options: object) -> Evaluation:
    options.setdefault("timeouts", LIMITS)
    return evaluate(REFERENCE, candidate, pool=pool.client, gpu=0, **options)  # type: ignore[arg-type]


def test_a_cuda_load_inline_candidate_is_timed_with_event_pairs(gpu_pool: PoolProc) -> None:
    ev = run(gpu_pool, cuda_candidate("krex_gpu_scaled_add", "if (i < n) out[i] = alpha * a[i] + b[i];"))
    assert ev.verdict == "correct", ev.summary + str(ev.metadata)
    timing = {k: v for k, v in ev.metadata.items() if k.startswith("timing") or k in ("input_sets", "idle_cpu_ms")}
    print("load_inline timing:", timing)
    assert ev.gpu_timed and ev.timing_method == "kernelbench-events" and "NVIDIA" in (ev.device or ""), timing
    assert ev.runtime_stats is not None and ev.runtime_stats.num_trials == 100
    # the judge's figure from outside the candidate's process (its round trip calibrated in the
    # region, a round ended by the driver's lock) is there, and the verdict's figure agrees with it
    assert ev.metadata.get("timing_bound_us") and ev.metadata.get("timing_roundtrip_us"), ev.metadata
    assert "checkpoint lock" in str(ev.metadata.get("timing_accounting")), ev.metadata
    assert ev.runtime >= ev.metadata["timing_bound_us"][0] * 0.95 - 1.0, ev.metadata  # type: ignore[index]
    assert ev.regions[0].region is not None and not ev.regions[0].region.get("simulated")


def test_an_illegal_address_costs_its_candidate_process_not_the_judge(gpu_pool: PoolProc) -> None:
    ev = run(gpu_pool, cuda_candidate("krex_gpu_illegal", "((float*)0x10)[i] = a[i];"))
    assert ev.verdict == "crashed", ev.summary
    assert "illegal" in (ev.metadata.get("cuda_error", "") + ev.metadata.get("worker_died", "")).lower()
    gpu_pool.wait_ready(120)
    # the sticky error poisoned the candidate's own context only: the judge's worker serves on
    assert ev.worker_pid in gpu_pool.worker_pids()
    again = run(gpu_pool, cuda_candidate("krex_gpu_scaled_add", "if (i < n) out[i] = alpha * a[i] + b[i];"))
    assert again.verdict == "correct"


SPIN = "while (((volatile const float*)a)[0] < 1e30f) {}"


def test_a_kernel_that_never_ends_is_a_timeout(gpu_pool: PoolProc) -> None:
    ev = run(
        gpu_pool,
        # spins on a volatile read of its input (finite, so never above 1e30): a loop on a local
        # volatile flag ended at once on the H200 (verdict "incorrect", the output never written)
        cuda_candidate("krex_gpu_forever", SPIN + " if (i < n) out[i] = a[i];"),
        timeouts={"load": 600.0, "check": 10.0, "time": 30.0},
    )
    assert ev.verdict == "timeout" and "check phase" in ev.metadata["timeout"], (ev.summary, ev.metadata)
    gpu_pool.wait_ready(120)


SIDE_STREAM = """
import torch
from torch import nn


class ModelNew(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha
        self.side = torch.cuda.Stream()
        self.big = torch.randn(4096, 4096, device="cuda")

    def forward(self, a, b):
        out = torch.add(b, a, alpha=self.alpha)
        with torch.cuda.stream(self.side):  # never joined: the event pair on the current stream misses it
            for _ in range(4):
                self.big @ self.big
        return out
"""


def test_work_on_a_side_stream_shows_as_a_disagreement(gpu_pool: PoolProc) -> None:
    ev = run(gpu_pool, SIDE_STREAM)
    assert ev.verdict == "correct"
    # the event pair misses the side stream; the judge's clock, outside the candidate, does not
    assert "timing_bound" in ev.metadata and ev.timing_method.startswith("outside"), ev.metadata


def test_device_memory_exhaustion_is_a_verdict(gpu_pool: PoolProc) -> None:
    hog = SIDE_STREAM.replace(
        "out = torch.add(b, a, alpha=self.alpha)", "torch.empty(1 << 42, device='cuda')\n        out = a"
    )
    ev = run(gpu_pool, hog)
    assert ev.verdict == "out_of_memory", ev.summary
