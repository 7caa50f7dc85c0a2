"""KernelBench-format problem: the row sums of tanh of a vector's outer product with itself, for a
vector of 1024 (a million tanh on four kilobytes of input: work far above what crosses)."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.outer(x, x)).sum(1)


def get_inputs():
    return [torch.randn(1024)]


def get_init_inputs():
    return []
