"""A submission importing the problem's own utils.py (laid out beside it)."""

import torch
from task import input_t, output_t
from utils import mismatches


def custom_kernel(data: input_t) -> output_t:
    x, out = data
    torch.add(-1.0, x, alpha=3.0, out=out)
    assert not mismatches(out, 3.0 * x - 1.0, 1e-5, 1e-6)
    return out
