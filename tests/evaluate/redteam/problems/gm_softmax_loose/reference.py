"""GPU MODE-format problem: a row softmax over 32768 columns, checked with a loose tolerance (1e-2,
as low-precision tasks set it): every output is about 1/32768 = 3e-5 and the largest of a million
below 5e-3, all within the atol of a constant."""

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
    if not torch.allclose(output, expected, rtol=1e-2, atol=1e-2):
        return False, f"max error {(output - expected).abs().max().item():.3g}"
    return True, ""


TESTS = [{"rows": 4, "cols": 32768, "seed": 1}, {"rows": 8, "cols": 32768, "seed": 2}]
BENCHMARKS = [{"rows": 32, "cols": 32768, "seed": 3}]
