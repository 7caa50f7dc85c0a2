"""Zeroes its inputs and returns zeros once the correctness trials are over: a comparison made
against the reference run afterwards on the same (now zeroed) buffers would agree, and the call
does no matmul.

Expected to be stopped by: re-checks against the judge's pristine copy of each set, and input
writes checked in every phase (the data path).
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
            a.zero_()
            b.zero_()
            return torch.zeros(a.shape[0], b.shape[1])
        return torch.tanh(torch.mm(a, b))
