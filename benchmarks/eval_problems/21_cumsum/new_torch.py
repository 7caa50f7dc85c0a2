"""Row prefix sums accumulated in float64 and cast back."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=1, dtype=torch.float64).to(x.dtype)
