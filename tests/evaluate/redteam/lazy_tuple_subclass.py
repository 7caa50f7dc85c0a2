"""A tuple subclass as the output: its one element is an empty buffer until someone iterates the
tuple to read it. The harness rebuilds tuples inside the timed call (``type(out)(... for o in
out)``): the first walk hands the pending work on to the tuple it builds instead of doing it; the
harness's walk to encode the output, after the call's clock has stopped, runs the matmul.

Expected to be stopped by: outputs written into the judge's buffers inside the timed call, and
exact types (a tuple subclass is refused by name) (the data path); the time from outside (the outside figure).
"""

import torch
from torch import nn

CHEAT = True
handoff = []  # work handed from a tuple being rebuilt to the tuple rebuilt from it


class Deferred(tuple):
    def __new__(cls, items, thunk=None):
        self = super().__new__(cls, items)
        handed = thunk is None and bool(handoff)
        self.thunk = handoff.pop() if handed else thunk
        self.walked = handed  # a rebuilt tuple does the work on its first walk
        return self

    def _force(self):
        thunk, self.thunk = self.thunk, None
        if thunk is not None:
            tuple.__getitem__(self, 0).copy_(thunk())

    def __iter__(self):
        if not self.walked and self.thunk is not None:  # the first walk: the work goes along
            self.walked = True
            handoff.append(self.thunk)
            self.thunk = None
            return tuple.__iter__(self)
        self._force()
        return tuple.__iter__(self)

    def __getitem__(self, i):
        self._force()
        return tuple.__getitem__(self, i)


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor):
        if CHEAT:
            out = torch.empty(a.shape[0], b.shape[1])
            return Deferred((out,), lambda: torch.tanh(torch.mm(a, b)))
        return (torch.tanh(torch.mm(a, b)),)
