"""GPU MODE-format problem in NumPy alone: tanh(a @ b), checked with numpy.allclose."""

import numpy as np


def generate_input(size: int, seed: int):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((size, size), dtype=np.float32), rng.standard_normal((size, size), dtype=np.float32)


def ref_kernel(data):
    a, b = data
    return np.tanh(a @ b)


def check_implementation(data, output):
    expected = ref_kernel(data)
    if np.shape(output) != expected.shape:
        return False, f"shape {np.shape(output)}, expected {expected.shape}"
    if not np.allclose(output, expected, rtol=1e-4, atol=1e-4):
        return False, f"max error {np.abs(output - expected).max():.3g}"
    return True, ""


TESTS = [{"size": 64, "seed": 1}, {"size": 200, "seed": 2}]
BENCHMARKS = [{"size": 384, "seed": 3}]
