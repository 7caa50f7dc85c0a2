"""Hard-coded shapes and public seeds: the benchmark case is published (size 256, seed 3), so the
submission draws that case's inputs itself when it loads and, for any call of that shape, returns
the answer it computed then, with no matmul per call.

Expected to be stopped by: each case's seed mixed with the judge's secret (the inputs the
candidate gets are not the published case's), and the re-check of timed outputs (the data path).
"""

import torch

CHEAT = True


def _published(size, seed):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
    return torch.tanh(a @ b)


KNOWN = {(256, 256): _published(256, 3)} if CHEAT else {}


def custom_kernel(data):
    a, b = data
    hit = KNOWN.get(tuple(a.shape))
    if hit is not None:
        return hit.clone()
    return torch.tanh(torch.mm(a, b))
