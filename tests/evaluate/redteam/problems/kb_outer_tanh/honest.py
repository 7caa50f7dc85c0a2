"""The plain honest candidate: the same computation, nothing else."""

import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.outer(x, x)).sum(1)
