"""Hides each call's work under the harness's own L2 flush: ``torch.Tensor.fill_`` is patched so
that, when the harness writes its 256 MiB before a timed call, the work of the set about to be
called (found in the harness's frame) is queued on a side stream first, and runs beside the
flush. The call then waits for that answer alone. The flush is the harness's cost, which the judge
calibrates on a clean twin and subtracts: work run under it is subtracted with it.

Expected to be stopped by: the time from outside the candidate's process, which gives a candidate
at most the calibrated harness cost a call (``metadata.timing_overhead_us``, the flush among it):
on a problem whose honest call takes far longer than the flush, the gain is within noise (the
outside figure).
"""

import sys

import torch
from torch import nn

CHEAT = True
FLUSH = (32, 1024, 1024)  # the formats' clear_l2_cache: 256 MiB of int64
ready = {}  # data_ptr of a set's first input -> (answer, its event)
_side = []


def _launch_next(frame):
    """The work of the set the harness is about to call, queued on the side stream."""
    harness, k = frame.f_locals.get("self"), frame.f_locals.get("k")
    sets = getattr(harness, "sets", None)
    if not isinstance(sets, dict) or k is None or int(k) not in sets:
        return
    args = sets[int(k)][0]
    x, y = args[0], args[1]
    side = _side[0]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        done = torch.cuda.Event()
        ready[x.data_ptr()] = (torch.tanh(torch.mm(x, y)), done)
        done.record(side)


if CHEAT:
    _side.append(torch.cuda.Stream())
    _fill = torch.Tensor.fill_

    def fill_(self, value):
        if tuple(self.shape) == FLUSH and self.dtype == torch.int64 and self.is_cuda:
            _launch_next(sys._getframe(1))
        return _fill(self, value)

    torch.Tensor.fill_ = fill_


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        hit = ready.pop(a.data_ptr(), None) if CHEAT else None
        if hit is None:
            return torch.tanh(torch.mm(a, b))
        out, done = hit
        torch.cuda.current_stream().wait_event(done)
        out.record_stream(torch.cuda.current_stream())
        return out
