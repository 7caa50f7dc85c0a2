"""Honest but wrong: as fast as the honest candidate, and off by a transposition."""

import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(a @ b.t())
