import torch
from torch import nn


class ModelNew(nn.Module):
    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b)  # the colon is missing
        return a * self.alpha + b
