"""Returns the product at once but leaves a thread working after the call: a timer around the
call never sees that work."""

import threading

from torch import nn


def busy(a, b, seconds=0.5):
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        (a @ b).sum()


class ModelNew(nn.Module):
    def forward(self, a, b):
        threading.Thread(target=busy, args=(a, b), name="tail-work", daemon=True).start()
        return a @ b
