"""GPU MODE-format problem: the maximum of each row (a reduction); its cases are in the file."""

import torch

TESTS = [{"rows": 8, "cols": 100, "seed": 1}, {"rows": 33, "cols": 7, "seed": 2}]
BENCHMARKS = [{"rows": 512, "cols": 512, "seed": 3}]


def generate_input(rows: int, cols: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g)


def ref_kernel(data):
    return data.max(dim=1).values


def check_implementation(data, output):
    expected = ref_kernel(data)
    if output.shape != expected.shape or not torch.equal(output, expected):
        return False, "row maxima differ"
    return True, ""
