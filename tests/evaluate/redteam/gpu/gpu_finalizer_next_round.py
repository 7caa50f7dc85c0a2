"""Moves the work out of the timed calls with finalizers, on the GPU: each output carries a
``weakref.finalize`` hook. The harness keeps a round's outputs shared until its next message, the
next round, which the judge sends after refilling the inputs in place; their release, before the
next round's first call (and before its event pair), launches the answer for the same inputs.
The timed call then finds its answer made, checks a few of its input values, and returns it.

Expected to be stopped by: the time from outside, all of the candidate's GPU work of the round
drained (the outside figure); round inputs invisible before the round is sent (the data path).
"""

import weakref

import torch
from torch import nn

CHEAT = True
ready = {}  # data_ptr of the first input -> (answer, a few input values it was made from)


def _answer(a, b):
    ready[a.data_ptr()] = (torch.tanh(torch.mm(a, b)), a.reshape(-1)[:8].clone())


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if CHEAT:
            hit = ready.pop(a.data_ptr(), None)
            fresh = hit is not None and torch.equal(hit[1], a.reshape(-1)[:8])
            out = hit[0] if fresh else torch.tanh(torch.mm(a, b))
            weakref.finalize(out, _answer, a, b)
            return out
        return torch.tanh(torch.mm(a, b))
