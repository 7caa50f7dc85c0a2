"""Answers a whole round from its first call, on a side stream: every set of a round is in the
candidate's process while the round runs (their CUDA IPC handles come with it), and the harness
that calls it holds them (found by a walk up the call's frames). The first call of a round queues
every set's work on a stream of its own and waits, on the current stream, for its own set's answer
alone; each later call waits for an answer already made. The event pair of every call but the
first brackets a wait for an event already past.

Expected to be stopped by: the time from outside the candidate's process, the round's bracket
counting every set's work however the calls share it (the outside figure).
"""

import sys

import torch
from torch import nn

CHEAT = True
ready = {}  # (the round's sets, data_ptr of a set's first input) -> (answer, its event)


def _round_sets():
    """The sets of the round being run (the harness's own dict of them), or None."""
    f = sys._getframe(2)
    while f is not None:
        harness = f.f_locals.get("self")
        if type(harness).__name__ == "Candidate" and isinstance(getattr(harness, "sets", None), dict):
            return harness.sets
        f = f.f_back
    return None


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = torch.cuda.Stream() if CHEAT else None

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not CHEAT:
            return torch.tanh(torch.mm(a, b))
        sets = _round_sets()
        hit = ready.pop((id(sets), a.data_ptr()), None)
        if hit is None and sets:
            ready.clear()
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                for args, *_ in sets.values():
                    x, y = args[0], args[1]
                    done = torch.cuda.Event()
                    ready[(id(sets), x.data_ptr())] = (torch.tanh(torch.mm(x, y)), done)
                    done.record(self.side)
            hit = ready.pop((id(sets), a.data_ptr()), None)
        if hit is None:
            return torch.tanh(torch.mm(a, b))
        out, done = hit
        torch.cuda.current_stream().wait_event(done)
        out.record_stream(torch.cuda.current_stream())
        return out
