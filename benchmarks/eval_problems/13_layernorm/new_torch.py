"""LayerNorm through torch.nn.functional.layer_norm with its own (equal) weight and bias."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, dim))
        self.bias = nn.Parameter(torch.linspace(-0.2, 0.2, dim))

    def forward(self, x):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], self.weight, self.bias, 1e-5)
