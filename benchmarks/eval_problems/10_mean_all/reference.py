"""Mean of every element (a 0-dimensional result)."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("EVAL_PROBLEM_SIZE") == "small"  # CPU-sized inputs for tests
N = 5000 if SMALL else 1 << 26


class Model(nn.Module):
    def forward(self, x):
        return torch.mean(x)


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return []
