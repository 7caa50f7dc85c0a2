"""``torch.empty`` holding a freed output: returns an uninitialised device tensor of the output's
shape, hoping the caching allocator hands back the block an earlier answer (the reference's, in
an evaluator that runs it in the same process, or this process's previous output) was freed from.

Expected to be stopped by: the reference run in the judge's process, never the candidate's, fresh
inputs each round, and outputs in the judge's buffers (the data path).
"""

import torch
from torch import nn

CHEAT = True


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if CHEAT:
            return torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
        return torch.tanh(torch.mm(a, b))
