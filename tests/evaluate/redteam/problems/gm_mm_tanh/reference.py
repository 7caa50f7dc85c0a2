"""GPU MODE-format problem: tanh(a @ b); the check is torch.allclose, as many GPU MODE tasks write it."""

import torch


def generate_input(size: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)


def ref_kernel(data):
    a, b = data
    return torch.tanh(a @ b)


def check_implementation(data, output):
    expected = ref_kernel(data)
    if output.shape != expected.shape:
        return False, f"shape {tuple(output.shape)}, expected {tuple(expected.shape)}"
    if not torch.allclose(output, expected, rtol=1e-4, atol=1e-4):
        return False, f"max error {(output - expected).abs().max().item():.3g}"
    return True, ""


TESTS = [{"size": 64, "seed": 1}, {"size": 200, "seed": 2}]
BENCHMARKS = [{"size": 256, "seed": 3}]
