"""Euclidean distances between every row of x and every row of y (over 1 ms on an H200 at the full size)."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("EVAL_PROBLEM_SIZE") == "small"  # CPU-sized inputs for tests
M, N, D = (50, 40, 30) if SMALL else (8192, 8192, 512)


class Model(nn.Module):
    def forward(self, x, y):
        return torch.cdist(x, y)


def get_inputs():
    return [torch.randn(M, D), torch.randn(N, D)]


def get_init_inputs():
    return []
