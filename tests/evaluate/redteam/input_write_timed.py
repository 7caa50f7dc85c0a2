"""Writes the answer into its first input and returns that input, but only once the correctness
trials are over (where writes into inputs and outputs aliasing inputs are looked for): the timed
calls allocate no output, and the answer crosses back as a view of the judge's own input memory,
with no copy.

Expected to be stopped by: aliasing and input-write checks in every phase, the timed rounds'
included (the data path).
"""

import torch
from torch import nn

CHEAT = True
HONEST_CALLS = 12


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if CHEAT and self.calls > HONEST_CALLS:
            return a.copy_(torch.tanh(torch.mm(a, b)))
        return torch.tanh(torch.mm(a, b))
