"""Leaky ReLU with a negative slope given at construction."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("EVAL_PROBLEM_SIZE") == "small"  # CPU-sized inputs for tests
ROWS, COLS = (33, 70) if SMALL else (8192, 8192)


class Model(nn.Module):
    def __init__(self, negative_slope):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        return torch.nn.functional.leaky_relu(x, self.negative_slope)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [0.05]
