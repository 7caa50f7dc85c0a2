"""The plain honest submission."""

import torch


def custom_kernel(data):
    a, b = data
    return torch.tanh(torch.mm(a, b))
