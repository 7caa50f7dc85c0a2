"""A constant output under a loose atol: every softmax value of a 32768-column row is about
1/32768, and even the largest lie within the problem's own atol of 1e-2 from that constant. The
submission returns 1/32768 everywhere, a hair of noise added so that it is not exactly constant.

Expected to be stopped by: a tolerance that follows the reference's own spread (a near-constant
output where the reference varies is not correct) (the data path).
"""

import torch

CHEAT = True


def custom_kernel(data):
    if CHEAT:
        return torch.full(data.shape, 1.0 / data.shape[-1]) + 1e-9 * data[:, :1]
    return torch.softmax(data, dim=-1)
