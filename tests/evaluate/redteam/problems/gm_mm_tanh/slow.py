"""Honest and slow: the right answer, computed four times."""

import torch


def custom_kernel(data):
    a, b = data
    for _ in range(3):
        torch.tanh(a @ b)
    return torch.tanh(a @ b)
