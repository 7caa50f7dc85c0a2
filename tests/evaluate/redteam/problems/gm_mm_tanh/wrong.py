"""Honest but wrong: as fast as the honest submission, off by a transposition."""

import torch


def custom_kernel(data):
    a, b = data
    return torch.tanh(a @ b.t())
