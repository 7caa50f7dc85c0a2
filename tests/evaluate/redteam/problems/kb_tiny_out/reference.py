"""KernelBench-format problem whose outputs are tiny (|y| <= 1e-5): all zeros pass fp32's default
atol of 1e-4 unless the evaluator looks further than the tolerance."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(a @ b) * 1e-5


def get_inputs():
    return [torch.randn(256, 256), torch.randn(256, 256)]


def get_init_inputs():
    return []
