"""Honest but wrong: as fast as the honest submission, over the wrong dimension."""

import torch


def custom_kernel(data):
    return torch.softmax(data, dim=0)
