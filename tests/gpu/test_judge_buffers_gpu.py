"""The judge's data path on a real NVIDIA GPU: an output in memory torch cannot share by CUDA IPC
is judged as any other (the candidate's side copies it into the judge's buffer), each input set
lies in a CUDA allocation of its own (an IPC handle opens a whole allocation), and the timing says
it thrashes L2 as KernelBench and GPU MODE do."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from krex_lab.evaluate import evaluate
from tests.gpu.helpers import nvidia_pool
from tests.support import ROOT
from tests.support.pool import PoolProc

pytestmark = pytest.mark.gpu

REFERENCE = ROOT / "tests" / "evaluate" / "problems" / "kb_scaled_add" / "reference.py"
LIMITS = {"load": 600.0, "check": 30.0, "time": 60.0}

# The answer computed by torch, then returned in memory from cudaMalloc itself (not torch's
# caching allocator), wrapped through __cuda_array_interface__: torch cannot share its storage by
# CUDA IPC (``_share_cuda_`` fails with "invalid device pointer"), as GPU MODE's sort and
# vectorsum solutions' outputs.
FOREIGN_MEMORY = """
import ctypes, glob, os, sys
import torch
from torch import nn


def _cudart():
    base = os.path.dirname(torch.__file__)
    found = sorted(glob.glob(os.path.join(base, "..", "nvidia", "cuda_runtime", "lib", "libcudart.so*")))
    found += sorted(glob.glob(os.path.join(base, "lib", "libcudart*.so*")))
    return ctypes.CDLL(found[0] if found else "libcudart.so")


CUDART = _cudart()
KEEP = []


class Raw:
    def __init__(self, n):
        ptr = ctypes.c_void_p()
        assert CUDART.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(4 * n)) == 0
        self.ptr, self.n = ptr.value, n
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr.value, False), "version": 3}


class ModelNew(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        raw = Raw(a.numel())
        KEEP.append(raw)
        out = torch.as_tensor(raw, device="cuda")
        out.copy_(self.alpha * a + b)
        return out
"""


@pytest.fixture(scope="module")
def gpu_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolProc]:
    yield from nvidia_pool(
        tmp_path_factory, "--Pool.preload=torch", "--workers-per-gpu=1", "--spares=1", "--Pool.interrupt_grace=2.0"
    )


def test_an_output_torch_cannot_share_by_ipc_is_judged_as_any_other(gpu_pool: PoolProc) -> None:
    ev = evaluate(REFERENCE, FOREIGN_MEMORY, pool=gpu_pool.client, gpu=0, timeouts=LIMITS, perf_trials=20)
    assert ev.verdict == "correct", ev.summary + str(ev.metadata)
    assert "invalid device pointer" not in str(ev.metadata)


def test_the_timing_says_it_thrashes_l2(gpu_pool: PoolProc) -> None:
    honest = "import torch\nfrom torch import nn\n\nclass ModelNew(nn.Module):\n"
    honest += "    def __init__(self, alpha):\n        super().__init__()\n        self.alpha = alpha\n\n"
    honest += "    def forward(self, a, b):\n        return self.alpha * a + b\n"
    ev = evaluate(REFERENCE, honest, pool=gpu_pool.client, gpu=0, timeouts=LIMITS, perf_trials=20)
    assert ev.verdict == "correct", ev.summary
    assert str(ev.metadata["l2_flush"]).startswith("256 MiB written before every timed call")


def test_each_set_lies_in_a_cuda_allocation_of_its_own() -> None:
    """Two sets shared in one message: no CUDA segment that holds a shared array holds anything
    else of the judge's (another set, a pristine copy, a reference output): one slab, the set's."""
    torch = pytest.importorskip("torch")
    from krex_lab.evaluate.channel import Shared
    from krex_lab.evaluate.judge.buffers import out_spec, share_set

    class Problem:
        def args(self, data: object) -> object:
            return data

    secret = torch.randn(1 << 16, device="cuda")  # the judge's own: a pristine copy, say
    data = [torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")]
    spec = out_spec(data[0] + data[1])
    shared = Shared()
    sets = [share_set(Problem(), data, spec, shared) for _ in range(2)]
    torch.cuda.synchronize()
    mine = {k: {int(x.data_ptr()) for x in cs.inputs + cs.outs} for k, cs in enumerate(sets)}
    seen = set()
    for segment in torch.cuda.memory_snapshot():
        lo, hi = segment["address"], segment["address"] + segment["total_size"]
        inside = {b["address"] for b in segment["blocks"] if b["state"] == "active_allocated"}
        owners = {k for k, ptrs in mine.items() if any(lo <= p < hi for p in ptrs)}
        if not owners:
            continue
        seen |= owners
        assert len(owners) == 1, "two sets share one CUDA allocation"
        assert not lo <= int(secret.data_ptr()) < hi, "a set's allocation holds the judge's own data"
        assert len(inside) == 1, "a set's allocation holds other arrays than its slab"
    assert seen == {0, 1}
