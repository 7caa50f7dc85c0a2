import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor):
        mean = x.sum(dim=1) / x.shape[1]
        var = ((x - mean[:, None]) ** 2).sum(dim=1) / x.shape[1]
        return mean, var
