"""GPU MODE-format problem: tanh(a @ b); the check compares elementwise with tensor operators."""

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
    close = (output - expected).abs() <= 1e-4 + 1e-4 * expected.abs()
    if not bool(close.all()) or (output != output).any():
        return False, f"max error {(output - expected).abs().max().item():.3g}"
    return True, ""


TESTS = [{"size": 64, "seed": 1}, {"size": 200, "seed": 2}]
BENCHMARKS = [{"size": 256, "seed": 3}]
