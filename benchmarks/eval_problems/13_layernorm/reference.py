"""LayerNorm over the last dimension, with a weight and bias (set deterministically)."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("EVAL_PROBLEM_SIZE") == "small"  # CPU-sized inputs for tests
ROWS, COLS = (33, 70) if SMALL else (8192, 4096)


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-5)
        with torch.no_grad():
            self.norm.weight.copy_(torch.linspace(0.5, 1.5, dim))
            self.norm.bias.copy_(torch.linspace(-0.2, 0.2, dim))

    def forward(self, x):
        return self.norm(x)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [COLS]
