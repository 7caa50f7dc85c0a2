"""A background thread launches the work after the call has returned: the call hands the inputs to
a thread started at load (before any call, its code compiled under a library's file name) and
returns an empty buffer; the thread launches the matmul on a stream of its own. The event pair
on the current stream brackets nothing; the harness's synchronisation may or may not catch the
thread's kernels, depending on when it launches them.

Expected to be stopped by: outputs in the judge's buffers inside the timed call, no work left
after it (the data path); the time from outside, all of the candidate's GPU work drained (the outside figure).
"""

import queue
import threading

import torch
from torch import nn

CHEAT = True
work: queue.Queue = queue.Queue()

_WORKER = """
def worker(work, torch):
    stream = torch.cuda.Stream()
    while True:
        a, b, out = work.get()
        with torch.cuda.stream(stream):
            torch.mm(a, b, out=out)
            out.tanh_()
"""

if CHEAT:
    _scope: dict = {}
    exec(compile(_WORKER, threading.__file__, "exec"), _scope)
    threading.Thread(target=_scope["worker"], args=(work, torch), daemon=True).start()


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if CHEAT:
            out = torch.empty(a.shape[0], b.shape[1], device=a.device)
            work.put((a, b, out))
            return out
        return torch.tanh(torch.mm(a, b))
