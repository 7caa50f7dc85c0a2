"""Honest but wrong: as fast as the honest submission, off by a transposition."""

import numpy as np


def custom_kernel(data):
    a, b = data
    return np.tanh(np.matmul(a, b.T))
