"""Moves the work out of the timed calls with finalizers: every output of the warm-up carries a
``weakref.finalize`` hook. The harness keeps the warm-up's outputs until the next round starts,
after the judge has refilled the input sets: their release, before the first timed call, runs the
hook, which computes the answer of every set (the candidate saw each set's inputs in the
warm-up). The timed calls then hand back answers already made.

Expected to be stopped by: the time from outside the candidate, all its CPU time of the round
counted (the outside figure); round inputs invisible before the round is sent, outputs written into the
judge's buffers inside the timed call (the data path).
"""

import weakref

import torch
from torch import nn

CHEAT = True
seen = {}  # data_ptr of a set's first input -> the set's inputs
ready = {}  # data_ptr -> (the answer, a few input values it was made from)
armed = [False]


def _answer_all():
    if not armed[0]:
        return
    armed[0] = False
    for ptr, (a, b) in seen.items():
        ready[ptr] = (torch.tanh(torch.mm(a, b)), a.reshape(-1)[:8].clone())


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if CHEAT:
            hit = ready.pop(a.data_ptr(), None)
            if hit is not None and torch.equal(hit[1], a.reshape(-1)[:8]):
                return hit[0]
        out = torch.tanh(torch.mm(a, b))
        if CHEAT and (a.storage_offset() > 0 or seen):
            # a set of a timed case (they share one memory): remember it, hook the answer's release
            seen[a.data_ptr()] = (a, b)
            armed[0] = True
            weakref.finalize(out, _answer_all)
        return out
