"""The reference's own kernel as the candidate: its speedup is 1 within noise, whatever the case's size."""

import torch


def custom_kernel(data):
    x, out = data
    torch.add(1.0, x, alpha=2.0, out=out)
    return out
