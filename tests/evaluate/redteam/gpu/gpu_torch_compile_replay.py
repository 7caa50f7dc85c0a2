"""torch.compile replay: ``mode="reduce-overhead"`` records the model into CUDA graphs and replays
them; the output it returns is a static buffer of the graph's pool that the next replay
overwrites. Returned as it is (no clone), an output read after later calls holds a later call's
answer.

Expected to be stopped by: outputs copied into the judge's buffers inside each timed call, and
the re-check of timed outputs (the data path). With one call per round and outputs read before the
next, it may be simply correct: no forged speedup either way.
"""

import torch
from torch import nn

CHEAT = True


def _plain(a, b):
    return torch.tanh(torch.mm(a, b))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.fn = torch.compile(_plain, mode="reduce-overhead") if CHEAT else _plain

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.fn(a, b)
