"""KernelBench-format problem with two outputs: each row's mean and variance."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor):
        return x.mean(dim=1), x.var(dim=1, unbiased=False)


def get_inputs():
    return [torch.randn(128, 300)]


def get_init_inputs():
    return []
