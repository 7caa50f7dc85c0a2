"""A reference that needs more simulated GPU memory than the GPU has: it runs out in the judge,
whoever else is there."""

import torch
from torch import nn

from krex_lab.gpu.fake import simulated_allocation


class Model(nn.Module):
    def forward(self, a: torch.Tensor) -> torch.Tensor:
        with simulated_allocation(64 << 30):
            return a * 2


def get_inputs():
    return [torch.randn(1024)]


def get_init_inputs():
    return []
