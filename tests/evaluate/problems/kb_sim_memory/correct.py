import time

import torch
from torch import nn

from krex_lab.gpu.fake import simulated_allocation


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor) -> torch.Tensor:
        with simulated_allocation(256 << 20):
            time.sleep(0.05)
            return a + a
