"""KernelBench-format problem on a simulated GPU's memory (the fake backend's): each call holds
256 MiB of it while it runs, as a real kernel's workspace would."""

import time

import torch
from torch import nn

from krex_lab.gpu.fake import simulated_allocation

HOLD = 256 << 20


class Model(nn.Module):
    def forward(self, a: torch.Tensor) -> torch.Tensor:
        with simulated_allocation(HOLD):
            time.sleep(0.05)
            return a * 2


def get_inputs():
    return [torch.randn(1024)]


def get_init_inputs():
    return []
