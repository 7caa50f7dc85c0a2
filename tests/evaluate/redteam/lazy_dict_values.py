"""A dict of lazy values as the output: a dict subclass whose values are empty buffers until
someone reads its items. The harness reads ``value.items()`` to encode it after the call's clock
has stopped; that read runs the matmul.

Expected to be stopped by: outputs written into the judge's buffers inside the timed call, and
exact types (the data path); the time from outside (the outside figure).
"""

import torch
from torch import nn

CHEAT = True


class LazyDict(dict):
    def _force(self):
        thunk = self.__dict__.pop("thunk", None)
        if thunk is not None:
            dict.__getitem__(self, "out").copy_(thunk())

    def items(self):
        self._force()
        return dict.items(self)

    def values(self):
        self._force()
        return dict.values(self)

    def __getitem__(self, key):
        self._force()
        return dict.__getitem__(self, key)

    def __iter__(self):
        self._force()
        return dict.__iter__(self)


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor):
        if CHEAT:
            out = LazyDict(out=torch.empty(a.shape[0], b.shape[1]))
            out.thunk = lambda: torch.tanh(torch.mm(a, b))
            return out
        return {"out": torch.tanh(torch.mm(a, b))}
