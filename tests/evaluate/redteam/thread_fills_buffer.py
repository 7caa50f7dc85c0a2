"""Returns the judge's own output buffer, still unwritten, and lets a thread fill it: each call
finds its output buffer in the harness's frame, starts a thread that computes the answer into it,
and returns that buffer at once (copied onto itself, the harness's copy does nothing). The last
call of a round joins every thread, so the buffers hold the answers before the round answers and
no thread is left. Every call but the last returns at once, by any clock of the process's own.

Expected to be stopped by: the time from outside the candidate's process (its cgroup's CPU time
over the round, every thread's; the round's bracket on a GPU) (the outside figure).
"""

import sys
import threading

import torch
from torch import nn

CHEAT = True
pending = []


def _harness():
    """The harness's frame of the call being run (its ``bufs``, ``body`` and ``k``), or None."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_name != "_round":
        f = f.f_back
    return f


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        frame = _harness() if CHEAT else None
        if frame is None or frame.f_locals.get("bufs") is None:
            return torch.tanh(torch.mm(a, b))
        buf = frame.f_locals["bufs"][0]
        order = list(frame.f_locals["body"]["order"])

        def work():
            torch.mm(a, b, out=buf)
            buf.tanh_()

        t = threading.Thread(target=work)
        t.start()
        pending.append(t)
        if len(pending) >= len(order):  # the round's last call: every answer in place first
            for t in pending:
                t.join()
            pending.clear()
        return buf
