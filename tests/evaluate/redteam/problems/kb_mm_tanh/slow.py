"""Honest and slow: the right answer, computed four times."""

import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            torch.tanh(a @ b)
        return torch.tanh(a @ b)
