"""Right, and slow: one row at a time."""

import torch
from task import input_t, output_t


def custom_kernel(data: input_t) -> output_t:
    (x,) = data
    return torch.stack([row.sum() for row in x])
