"""A thread computes the next round while the judge refills the input sets: the candidate saw
every set's inputs in the warm-up (the sets live in memory shared with the judge, refilled in place
between rounds); a watcher thread notices each set's values change, waits for them to settle, and
computes that set's answer before the round is sent. The timed calls hand back answers already
made. The watcher runs code compiled under a library's file name (a look for threads running the
candidate's own code finds none) and sleeps between looks, the GIL released.

Expected to be stopped by: round inputs invisible before the round is sent (the data path); the time
from outside the candidate, all its threads' CPU counted (the outside figure).
"""

import threading
import time

import torch
from torch import nn

CHEAT = True
sets = {}  # data_ptr of a set's first input -> (a, b)
ready = {}  # data_ptr -> (answer, the input values it was made from)

_WATCH = """
def watch(sets, ready, answer, sample):
    last = {}
    while True:
        time.sleep(0.0005)
        for ptr, (a, b) in list(sets.items()):
            now = sample(a, b)
            if last.get(ptr) is not None and torch.equal(last[ptr], now):
                continue
            time.sleep(0.001)  # the judge writes a set's inputs one after the other: let them settle
            before = sample(a, b)
            out = answer(a, b)
            if torch.equal(before, sample(a, b)):  # unchanged while it was computed
                last[ptr] = before
                ready[ptr] = (out, before)
"""


def _sample(a, b):
    # values spread over both inputs (a copy may write its parts in any order)
    return torch.cat([a.reshape(-1)[::4099], b.reshape(-1)[::4099]])


def _answer(a, b):
    return torch.tanh(torch.mm(a, b))


if CHEAT:
    scope = {"time": time, "torch": torch}
    exec(compile(_WATCH, threading.__file__, "exec"), scope)
    threading.Thread(target=scope["watch"], args=(sets, ready, _answer, _sample), daemon=True).start()


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if CHEAT:
            hit = ready.get(a.data_ptr())
            if hit is not None and torch.equal(hit[1], _sample(a, b)):
                return hit[0]
            if a.storage_offset() > 0 or sets:  # the sets of a timed case share one memory
                sets[a.data_ptr()] = (a, b)
        return torch.tanh(torch.mm(a, b))
