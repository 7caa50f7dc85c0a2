"""Right, and slow: the answer computed 200 times over, in small pieces."""

import torch
from task import input_t, output_t


def custom_kernel(data: input_t) -> output_t:
    x, out = data
    for _ in range(200):
        for part, into in zip(x.split(256), out.split(256)):
            torch.add(-1.0, part, alpha=3.0, out=into)
    return out
