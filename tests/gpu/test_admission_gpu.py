"""Admission by GPU memory on a real NVIDIA GPU: NVML's figures (a foreign process's memory
included), the judge's measured footprint (torch's peak), evaluations that wait for memory rather
than fail, and a candidate that alone exceeds its allowance judged out_of_memory with figures."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from krex_lab.evaluate.admission import MemoryPolicy
from krex_lab.evaluate.batch import BatchRecord, Pair
from krex_lab.evaluate.many import run_pairs
from krex_lab.evaluate.options import EvaluateOptions
from tests.gpu.helpers import nvidia_pool
from tests.support.pool import PoolProc

pytestmark = pytest.mark.gpu

GiB = 1 << 30
LIMITS = {"load": 300.0, "check": 120.0, "time": 120.0}

#: 1 GiB per input, 1 GiB per output: with the judge's pristine copies, a reference peak of about 6 GiB
REFERENCE = """
import torch
from torch import nn

N = 1 << 28


class Model(nn.Module):
    def forward(self, a, b):
        return a * 2 + b


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
"""
CORRECT = """
import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.add(b, a, alpha=2)
"""
GREEDY = """
import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        self.hoard = torch.empty(1 << 40, dtype=torch.uint8, device=a.device)  # a TiB
        return a * 2 + b
"""
HOLDER = """
import sys, time, torch
free, total = torch.cuda.mem_get_info()
keep = int(float(sys.argv[1]) * (1 << 30))
held = torch.empty(max(0, free - keep), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("held", held.numel(), flush=True)
time.sleep(3600)
"""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def gpu_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolProc]:
    yield from nvidia_pool(tmp_path_factory, "--Pool.preload=torch", "--workers-per-gpu=1", "--spares=0")


def _pairs(tmp: Path, candidates: list[str]) -> list[Pair]:
    (tmp / "reference.py").write_text(REFERENCE)
    out = []
    for i, text in enumerate(candidates):
        cand = tmp / f"candidate{i}.py"
        cand.write_text(text)
        out.append(Pair(index=i, line=i, reference=str(tmp / "reference.py"), candidate=str(cand), id=str(i)))
    return out


def _run(pool: PoolProc, pairs: list[Pair], jobs: int, stream: io.StringIO) -> list[BatchRecord]:
    out: list[BatchRecord] = []
    run_pairs(
        pairs,
        jobs=jobs,
        defaults=EvaluateOptions.of({"perf_trials": 10, "timeouts": LIMITS}),
        pool=pool.client,
        emit=out.append,
        progress=stream,
        memory=MemoryPolicy(reserve_mb=1024, unknown_footprint_mb=16384, poll_s=0.2),
    )
    return out


def test_beside_a_foreign_process_evaluations_wait_for_memory_and_none_fails(
    gpu_pool: PoolProc, tmp_path: Path
) -> None:
    # leave about 60 GiB: the first ones are admitted with 16 GiB each (not measured yet), the rest with
    # their measured footprint (the reference's peak of about 6 GiB twice, its input sets, a candidate's
    # twice that peak: about 25 GiB): two at a time, never the four the jobs allow
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "60"], stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline().startswith(b"held")
    stream = Terminal()
    try:
        records = _run(gpu_pool, _pairs(tmp_path, [CORRECT] * 6), jobs=4, stream=stream)
    finally:
        holder.kill()
        holder.wait()
    assert sorted(r.index for r in records) == list(range(6))
    assert [r.verdict for r in records] == ["correct"] * 6, [r.summary for r in records]
    peak = int(records[0].metadata["memory"]["reference_peak"])
    assert 2 * GiB <= peak <= 12 * GiB, records[0].metadata["memory"]
    waited = [r.metadata["admission"]["waited_for_memory_s"] for r in records]
    assert sum(w > 0.5 for w in waited) >= 2, waited
    assert "waiting for GPU memory" in stream.getvalue()


def test_a_candidate_beyond_its_allowance_is_out_of_memory_with_figures(gpu_pool: PoolProc, tmp_path: Path) -> None:
    (record,) = _run(gpu_pool, _pairs(tmp_path, [GREEDY]), jobs=1, stream=Terminal())
    assert record.verdict == "out_of_memory", record.summary
    assert record.metadata["admission"]["attempts"] == 1
    assert "asked for 1024.00 GiB" in record.metadata["out_of_memory_figures"], record.metadata


FORGED_OOM = """
import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 79.19 GiB of which "
            "0 bytes is free. Of the allocated memory 0.01 GiB is allocated by PyTorch"
        )
"""


def test_an_out_of_memory_the_candidate_only_says_is_its_own(gpu_pool: PoolProc, tmp_path: Path) -> None:
    """The driver's free memory, read by the judge as the failure arrives, decides, not the
    candidate's words: with the 2 MiB it asked for free, it is its own verdict, run once."""
    (record,) = _run(gpu_pool, _pairs(tmp_path, [FORGED_OOM]), jobs=1, stream=Terminal())
    assert record.verdict == "out_of_memory", record.summary
    assert record.metadata["admission"]["attempts"] == 1, record.metadata["admission"]
    assert int(record.metadata["out_of_memory_device_free"]) > 2 << 20, record.metadata
