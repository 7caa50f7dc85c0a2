"""Right for its first calls, then wrong, and not by a kept answer (its answer plus a little): the
refilled trial finds it wrong, as a later call of a check would, never stale."""

import torch
from torch import nn

CALLS = [0]
#: the tests' three trials and the refilled trial's first call
RIGHT = 4


class ModelNew(nn.Module):
    def forward(self, x):
        CALLS[0] += 1
        out = torch.softmax(x, dim=-1)
        return out if CALLS[0] <= RIGHT else out + 0.5
