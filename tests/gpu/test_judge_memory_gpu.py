"""The judge's GPU memory after evaluations whose candidate dies holding the judge's input sets.

torch keeps memory it shared by CUDA IPC until the receiver lets go of it, and a candidate killed
at the end of its evaluation (or crashed, or keeping its inputs in a cache of its own) never does:
before the judge took its shares back (:mod:`krex_lab.evaluate.cuda_ipc`) each such evaluation
left its sets allocated in the judge, and the GPU ran out of memory after a few dozen. Here each
kind runs several times on one worker, and the GPU's used memory must not grow."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from krex_lab.evaluate import Evaluation, evaluate
from krex_lab.evaluate.judge.rounds import LET_GO
from tests.gpu.helpers import nvidia_pool
from tests.support.pool import PoolProc

pytestmark = pytest.mark.gpu

GiB = 1 << 30
LIMITS = {"load": 300.0, "check": 120.0, "time": 120.0}

#: 256 MiB an input: a round of sets is gigabytes
REFERENCE = """
import torch
from torch import nn

N = 1 << 26


class Model(nn.Module):
    def forward(self, a, b):
        return a * 2 + b


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
"""
#: keeps every input it is given, as a cache of its own would: its process dies holding them
HOARDER = """
import torch
from torch import nn

KEPT = []


class ModelNew(nn.Module):
    def forward(self, a, b):
        KEPT.append((a, b))
        return torch.add(b, a, alpha=2)
"""
#: dies in its third timed call, holding the round's sets (no release is asked of a dead process)
CRASHER = """
import os
import torch
from torch import nn

CALLS = [0]


class ModelNew(nn.Module):
    def forward(self, a, b):
        CALLS[0] += 1
        if CALLS[0] > 8:
            os._exit(3)
        return torch.add(b, a, alpha=2)
"""
HONEST = """
import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.add(b, a, alpha=2)
"""


@pytest.fixture(scope="module")
def gpu_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolProc]:
    yield from nvidia_pool(tmp_path_factory, "--Pool.preload=torch", "--workers-per-gpu=1", "--spares=0")


def _used() -> int:
    from krex_lab.gpu.nvml import PynvmlApi

    nvml = PynvmlApi()
    try:
        return nvml.memory(0)[1]
    finally:
        nvml.shutdown()


def _settled(limit: int, timeout: float = 15.0) -> int:
    """The GPU's used memory once it is at most ``limit`` (or what it is after ``timeout``)."""
    end = time.monotonic() + timeout
    used = _used()
    while used > limit and time.monotonic() < end:
        time.sleep(0.25)
        used = _used()
    return used


@pytest.mark.parametrize("kind", ["hoarder", "crasher", "honest"])
def test_evaluations_whose_candidate_dies_holding_the_sets_leave_the_judge_no_bigger(
    gpu_pool: PoolProc, kind: str
) -> None:
    candidate = {"hoarder": HOARDER, "crasher": CRASHER, "honest": HONEST}[kind]
    runs: list[Evaluation] = []
    used: list[int] = []
    for _ in range(5):
        runs.append(evaluate(REFERENCE, candidate, pool=gpu_pool.client, gpu=0, timeouts=LIMITS, perf_trials=20))
        used.append(_settled(used[0] + GiB // 2 if used else 1 << 62))
    print(kind, [r.verdict for r in runs], "used GiB after each:", [round(u / GiB, 2) for u in used])
    want = {"runtime_error", "crashed"} if kind == "crasher" else {"correct"}
    if kind == "hoarder" and LET_GO:  # told to let go of a round, it kept it
        want = {"rejected"}
        assert all("kept_inputs" in str(r.metadata.get("rejected")) for r in runs), [r.metadata for r in runs]
    assert all(r.verdict in want for r in runs), [(r.verdict, r.summary) for r in runs]
    # the first evaluation leaves the worker's caches warm; the later ones add nothing
    assert used[-1] - used[0] <= GiB // 2, [round(u / GiB, 2) for u in used]


def _marks(ev: Evaluation) -> list[tuple[int, int, int, int]]:
    """(round, MiB allocated and MiB reserved in the judge, CUDA IPC shares still held) from the
    verdict's trace."""
    trace = str(ev.metadata.get("judge_memory_rounds", ""))
    found = re.findall(r"round (\d+): (\d+) MiB allocated, (\d+) MiB reserved, (\d+) shares held", trace)
    return [(int(r), int(a), int(m), int(h)) for r, a, m, h in found]


def test_a_round_s_sets_are_given_back_before_the_next_rounds_fill_the_gpu(gpu_pool: PoolProc) -> None:
    """768 MiB a set, one set a round (the sets' budget is 512 MiB), 40 rounds: each round's sets
    are freed once the candidate's process has the next round's, so the judge's allocated and
    reserved memory stay within a few sets over the rounds (reserved grew by a set a round while
    the sets' retired memory pools kept what they had cached), and so do the shares a receiver
    holds."""
    ev = evaluate(REFERENCE, HONEST, pool=gpu_pool.client, gpu=0, timeouts=LIMITS, perf_trials=40)
    marks = _marks(ev)
    print("verdict", ev.verdict, "| judge_memory_rounds:", ev.metadata.get("judge_memory_rounds"))
    assert ev.verdict == "correct", ev.summary
    assert len(marks) == 6 and marks[-1][0] >= 30, marks
    first, last = marks[0], marks[-1]
    assert last[1] - first[1] <= 3 * 1024, marks  # MiB: a few sets at most, never one per round
    assert last[2] - first[2] <= 3 * 1024, marks
    assert last[3] <= first[3] + 8, marks
