"""Honest and slow: the right answer, computed four times."""

import torch


def custom_kernel(data):
    for _ in range(3):
        torch.softmax(data, dim=-1)
    return torch.softmax(data, dim=-1)
