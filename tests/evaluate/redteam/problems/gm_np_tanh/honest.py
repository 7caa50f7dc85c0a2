"""The plain honest submission."""

import numpy as np


def custom_kernel(data):
    a, b = data
    return np.tanh(np.matmul(a, b))
