"""Euclidean distances from |x|^2 + |y|^2 - 2 x y^T, one matmul."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, y):
        xx = (x * x).sum(dim=1, keepdim=True)
        yy = (y * y).sum(dim=1)
        return torch.addmm(xx + yy, x, y.t(), alpha=-2.0).clamp_min_(0.0).sqrt_()
