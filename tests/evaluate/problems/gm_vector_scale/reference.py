"""GPU MODE-format problem: out = 2 x + 1, written into an output buffer the input carries."""

import torch


def generate_input(size: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(size, generator=g), torch.empty(size)


def ref_kernel(data):
    x, out = data
    torch.add(1.0, x, alpha=2.0, out=out)
    return out


def check_implementation(data, output):
    expected = ref_kernel(data)
    if output.shape != expected.shape:
        return False, f"shape {tuple(output.shape)}, expected {tuple(expected.shape)}"
    if not torch.allclose(output, expected, rtol=1e-5, atol=1e-5):
        return False, f"max error {(output - expected).abs().max().item():.3g}"
    return True, ""
