import torch
from torch import nn

from krex_lab.gpu.fake import simulated_allocation


class ModelNew(nn.Module):
    """Asks for far more simulated GPU memory than its share (or the GPU) has."""

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        with simulated_allocation(64 << 30):
            return a + a
