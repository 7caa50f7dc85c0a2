"""GPU MODE-format problem: a row softmax over 4096 columns, checked with a loose atol (1e-3, as
low-precision tasks set it): every output is about 1/4096 = 2.4e-4, well inside the atol of a
constant."""

import torch


def generate_input(rows: int, cols: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g)


def ref_kernel(data):
    return torch.softmax(data, dim=-1)


def check_implementation(data, output):
    expected = ref_kernel(data)
    if output.shape != expected.shape:
        return False, f"shape {tuple(output.shape)}, expected {tuple(expected.shape)}"
    if not torch.allclose(output, expected, rtol=1e-3, atol=1e-3):
        return False, f"max error {(output - expected).abs().max().item():.3g}"
    return True, ""


TESTS = [{"rows": 8, "cols": 4096, "seed": 1}, {"rows": 32, "cols": 4096, "seed": 2}]
BENCHMARKS = [{"rows": 128, "cols": 4096, "seed": 3}]
