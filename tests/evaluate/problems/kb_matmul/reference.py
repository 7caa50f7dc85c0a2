"""KernelBench-format problem: a matrix product."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


def get_inputs():
    return [torch.randn(128, 96), torch.randn(96, 64)]


def get_init_inputs():
    return []
