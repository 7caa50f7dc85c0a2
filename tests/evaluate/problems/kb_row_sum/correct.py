import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # pairwise: two halves, then their sum (a different summation order, within fp32 tolerance)
        half = x.shape[1] // 2
        return x[:, :half].sum(dim=1) + x[:, half:].sum(dim=1)
