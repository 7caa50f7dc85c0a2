"""Sigmoid through tanh: sigmoid(x) = (1 + tanh(x / 2)) / 2."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.tanh(x * 0.5).mul_(0.5).add_(0.5)
