"""Answers a whole round from its first call, through its own file descriptors: while a round
runs, every set of it is a memfd this process holds (``/proc/self/fd``, ``memfd:krex-set``). The
first call that meets a set it has no answer for maps every such memfd, reads each set's inputs
at the offsets its own inputs have in theirs, and computes every answer at once (one batched
matmul); the round's later calls hand them back, found by a few input values. Every call but the
first is a copy, by any clock of this process's own.

Expected to be stopped by: the time from outside the candidate's process (its cgroup's CPU time
over the whole round on a CPU, the round's bracket on a GPU), which counts the first call's
batched work however the calls share it (the outside figure).
"""

import mmap
import os

import torch
from torch import nn

CHEAT = True
ready = {}  # a few input values of a set -> its answer


def _key(a: torch.Tensor) -> tuple[float, ...]:
    return tuple(a.reshape(-1)[:8].tolist())


def _answer_round(a: torch.Tensor, b: torch.Tensor) -> None:
    """Every set of the round that this process's descriptors reach, answered at once."""
    size = a.untyped_storage().nbytes()
    at_a, at_b = a.storage_offset() * a.element_size(), b.storage_offset() * b.element_size()
    xs, ys = [], []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:krex-set"):
                continue
            if os.fstat(int(fd)).st_size != size:
                continue
            mm = mmap.mmap(int(fd), size)  # stays mapped after the round closes the fd
        except (OSError, ValueError):
            continue
        raw = torch.frombuffer(mm, dtype=torch.uint8)
        xs.append(raw[at_a : at_a + a.nbytes].view(a.dtype).view(a.shape))
        ys.append(raw[at_b : at_b + b.nbytes].view(b.dtype).view(b.shape))
    if xs:
        for x, out in zip(xs, torch.tanh(torch.bmm(torch.stack(xs), torch.stack(ys)))):
            ready[_key(x)] = out


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if CHEAT:
            hit = ready.pop(_key(a), None)
            if hit is None:
                ready.clear()
                _answer_round(a, b)
                hit = ready.pop(_key(a), None)
            if hit is not None:
                return hit
        return torch.tanh(torch.mm(a, b))
