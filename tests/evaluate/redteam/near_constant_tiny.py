"""A near-constant output on a problem whose outputs are tiny (|y| <= 1e-5): no matmul, a
constant of the outputs' scale with a little noise on it, so it is neither all zeros nor exactly
constant, and every element lies within fp32's default atol (1e-4) of the reference's.

Expected to be stopped by: a tolerance that follows the reference's own spread on tiny outputs
(the data path).
"""

import torch
from torch import nn

CHEAT = True


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if CHEAT:
            return torch.full((a.shape[0], b.shape[1]), 1e-7) + 1e-9 * a[:, :1]
        return torch.tanh(torch.mm(a, b)) * 1e-5
