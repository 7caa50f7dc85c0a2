"""(On the GPU.) A lazy tensor that survives the harness's own materialising of subclasses: the harness clones a
subclassed output inside the timed call (``torch.Tensor.clone(out).as_subclass(torch.Tensor)``);
this subclass answers that clone with a stand-in whose ``as_subclass`` hands the lazy tensor back
untouched, so the matmul runs only when the reply path reads the values (``detach()`` when the
output is encoded), after the call's clock has stopped.

Expected to be stopped by: outputs written into the judge's buffers inside the timed call, and
the exact type of each output (the data path); the time from outside the candidate (the outside figure).
"""

import torch
from torch import nn

CHEAT = True
FORCE = {
    "_share_cuda_",
    "untyped_storage",
    "data_ptr",
    "detach",
    "cpu",
    "contiguous",
    "numpy",
    "tolist",
    "item",
    "__getitem__",
    "copy_",
}


class _Stand:
    def __init__(self, lazy):
        self.lazy = lazy

    def as_subclass(self, cls):
        return self.lazy


class Lazy(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name == "clone" and args and isinstance(args[0], Lazy) and "thunk" in args[0].__dict__:
            return _Stand(args[0])
        if name in FORCE:
            args = tuple(a.force() if isinstance(a, Lazy) else a for a in args)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))

    def force(self):
        thunk = self.__dict__.pop("thunk", None)
        plain = self.as_subclass(torch.Tensor)
        if thunk is not None:
            plain.copy_(thunk())
        return plain


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if CHEAT:
            out = torch.empty(a.shape[0], b.shape[1], device=a.device).as_subclass(Lazy)
            out.thunk = lambda: torch.tanh(torch.mm(a, b))  # the shared inputs, read at encode time
            return out
        return torch.tanh(torch.mm(a, b))
