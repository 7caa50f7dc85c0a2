"""An honest candidate through torch.compile (inductor): its threads and compile workers are the
framework's, not work left running."""

import torch
from torch import nn


class ModelNew(nn.Module):
    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.alpha = alpha
        self.fn = torch.compile(lambda a, b: self.alpha * a + b)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.fn(a, b)
