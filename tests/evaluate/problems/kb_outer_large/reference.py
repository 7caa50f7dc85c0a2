"""KernelBench-format problem with a large output: the outer product of two vectors, 2048 x 8192
fp32 (64 MiB) from inputs of 40 KiB (a host float64 copy of the output would take 128 MiB)."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.outer(a, b)


def get_inputs():
    return [torch.randn(2048), torch.randn(8192)]


def get_init_inputs():
    return []
