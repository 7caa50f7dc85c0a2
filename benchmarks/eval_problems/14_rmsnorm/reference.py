"""RMSNorm over the last dimension: x / sqrt(mean(x^2) + eps) * weight."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("EVAL_PROBLEM_SIZE") == "small"  # CPU-sized inputs for tests
ROWS, COLS = (33, 70) if SMALL else (8192, 4096)


class Model(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, dim))

    def forward(self, x):
        rms = torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps)
        return x / rms * self.weight


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [COLS, 1e-6]
