"""KernelBench-format problem with a large output: the outer product of two vectors, 4096 x 8192
fp32 (128 MiB) from inputs of 48 KiB (a host float64 copy of the output would take 256 MiB)."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.outer(a, b)


def get_inputs():
    return [torch.randn(4096), torch.randn(8192)]


def get_init_inputs():
    return []
