"""The plain honest submission."""

import torch


def custom_kernel(data):
    return torch.softmax(data, dim=-1)
