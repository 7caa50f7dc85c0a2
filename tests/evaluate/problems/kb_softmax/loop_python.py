"""Never returns from its first call (a Python loop: an interrupt stops it)."""

from torch import nn


class ModelNew(nn.Module):
    def forward(self, x):
        while True:
            pass
