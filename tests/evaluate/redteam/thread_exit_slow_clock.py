"""Does the work in a thread that has exited before anyone reads the CPU clocks, and slows the
harness's clock: each call starts a thread for the matmul and joins it. An exited thread's CPU
time is no longer any thread's of the process (/proc/PID/task lists live ones), and the clock the
harness times calls with (``time.perf_counter``) runs 1000 times slow: the in-process figure is
tiny, and the CPU-time fallback counts only the main thread's waiting.

Expected to be stopped by: the time from outside, with the CPU time of every thread, exited ones
included (the cgroup's cpu.stat) (the outside figure).
"""

import threading
import time

import torch
from torch import nn

CHEAT = True
SLOW = 1000


def _slow_clock():
    real = time.perf_counter
    origin = real()
    time.perf_counter = lambda: origin + (real() - origin) / SLOW


if CHEAT:
    _slow_clock()


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not CHEAT:
            return torch.tanh(torch.mm(a, b))
        out = torch.empty(a.shape[0], b.shape[1])

        def work():
            torch.mm(a, b, out=out)
            out.tanh_()

        t = threading.Thread(target=work)
        t.start()
        t.join()
        return out
