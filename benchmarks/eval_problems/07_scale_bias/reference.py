"""y = x * alpha + beta, both scalars given at construction."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("EVAL_PROBLEM_SIZE") == "small"  # CPU-sized inputs for tests
ROWS, COLS = (33, 70) if SMALL else (8192, 8192)


class Model(nn.Module):
    def __init__(self, alpha, beta):
        super().__init__()
        self.alpha, self.beta = alpha, beta

    def forward(self, x):
        return x * self.alpha + self.beta


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [2.5, -0.5]
