"""Honest and slow: the right answer, computed four times."""

import numpy as np


def custom_kernel(data):
    a, b = data
    for _ in range(3):
        np.tanh(a @ b)
    return np.tanh(a @ b)
