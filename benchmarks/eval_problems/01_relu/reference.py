"""ReLU of a float32 matrix."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("EVAL_PROBLEM_SIZE") == "small"  # CPU-sized inputs for tests
ROWS, COLS = (33, 70) if SMALL else (8192, 8192)


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
