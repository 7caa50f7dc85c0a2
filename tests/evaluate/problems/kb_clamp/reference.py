"""KernelBench-format problem: clamp to [-100, 100] (on its inputs, the identity)."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, -100.0, 100.0)


def get_inputs():
    return [torch.randn(2048)]


def get_init_inputs():
    return []
