"""Regenerated seeds: guesses the seed the judge drew the inputs with by drawing them itself under
the seeds people use (0 to 511, 42, 1234, 2024, ...), and, once one reproduces an input it was
given, predicts the next sets (seed + 1, seed + 2, ...) and answers them ahead of their calls.

Expected to be stopped by: secret seeds from a cryptographic source (the data path) (a seed drawn in
secret is already out of this list's reach).
"""

import torch
from torch import nn

CHEAT = True
GUESSES = [*range(512), 42, 1234, 2024, 12345, 31337, 1 << 20]
answers = {}
state = {"tried": False}


def _key(a):
    return a.reshape(-1)[:8].numpy().tobytes()


def _draw(seed):
    torch.random.default_generator.manual_seed(seed)
    return torch.randn(256, 256), torch.randn(256, 256)


def _guess(a):
    state["tried"] = True
    want = _key(a)
    for seed in GUESSES:
        torch.random.default_generator.manual_seed(seed)
        if _key(torch.randn(256, 256)) == want:
            for nxt in range(seed + 1, seed + 200):
                x, y = _draw(nxt)
                answers[_key(x)] = torch.tanh(torch.mm(x, y))
            return


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if CHEAT:
            hit = answers.pop(_key(a), None)
            if hit is not None:
                return hit
            if not state["tried"] and tuple(a.shape) == (256, 256):
                _guess(a)
        return torch.tanh(torch.mm(a, b))
