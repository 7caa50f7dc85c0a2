"""Sum of three vectors."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("EVAL_PROBLEM_SIZE") == "small"  # CPU-sized inputs for tests
N = 1000 if SMALL else 1 << 26


class Model(nn.Module):
    def forward(self, a, b, c):
        return a + b + c


def get_inputs():
    return [torch.randn(N), torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
