"""Answers a whole round from its first call: the input sets of a timed case are packed one after
another into one shared memory, and every input's storage is that whole memory. The first call
of a round views every set through its own input's storage (``as_strided`` from offset 0) and
computes all the answers at once, in one batched matmul; the later calls of the round hand them
back. Sets it had seen (in the warm-up) are found by their offsets in that memory.

Expected to be stopped by: a round's inputs invisible to the candidate before that round's call
(each call's inputs in memory of their own) (the data path).
"""

import torch
from torch import nn

CHEAT = True
offsets = set()  # storage offsets of the first input of every set seen
ready = {}  # storage offset -> (answer, a few input values it was made from)


def _answer_round(a: torch.Tensor, b: torch.Tensor) -> None:
    starts = sorted(offsets)
    gap = b.storage_offset() - a.storage_offset()  # where a set's second input lies after its first
    n, m = a.shape
    # as_strided's offset counts from the start of the storage: the whole shared memory
    xs = torch.stack([a.as_strided((n, m), (m, 1), s) for s in starts])
    ys = torch.stack([a.as_strided(tuple(b.shape), (b.shape[1], 1), s + gap) for s in starts])
    answers = torch.tanh(torch.bmm(xs, ys))
    for s, x, out in zip(starts, xs, answers):
        ready[s] = (out, x.reshape(-1)[:8].clone())


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if CHEAT and (a.storage_offset() > 0 or offsets):
            off = a.storage_offset()
            hit = ready.pop(off, None)
            if hit is not None and torch.equal(hit[1], a.reshape(-1)[:8]):
                return hit[0]
            if off == 0 and len(offsets) > 1:  # the first set: answer the round at once
                ready.clear()
                _answer_round(a, b)
                hit = ready.pop(off, None)
                if hit is not None:
                    return hit[0]
            offsets.add(off)
        return torch.tanh(torch.mm(a, b))
