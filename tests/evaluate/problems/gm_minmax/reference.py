"""GPU MODE-format problem with two outputs: the minimum and the maximum of each column."""

import torch

TESTS = [{"rows": 50, "cols": 20, "seed": 5}, {"rows": 3, "cols": 300, "seed": 6}]
BENCHMARKS = [{"rows": 1024, "cols": 256, "seed": 7}]


def generate_input(rows: int, cols: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g)


def ref_kernel(data):
    return data.min(dim=0).values, data.max(dim=0).values


def check_implementation(data, output):
    lo, hi = ref_kernel(data)
    if not (isinstance(output, tuple) and len(output) == 2):
        return False, "expected (minimum, maximum)"
    if not torch.equal(output[0], lo):
        return False, "minima differ"
    if not torch.equal(output[1], hi):
        return False, "maxima differ"
    return True, ""
