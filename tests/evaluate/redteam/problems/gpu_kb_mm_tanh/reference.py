"""KernelBench-format GPU problem: tanh(a @ b) of two 4096 x 4096 fp32 matrices (about a
millisecond on an H200): big enough that a forged time is far off an honest one."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(a @ b)


def get_inputs():
    return [torch.randn(4096, 4096), torch.randn(4096, 4096)]


def get_init_inputs():
    return []
