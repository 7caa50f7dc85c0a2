"""Does the work in a thread that has exited before anyone reads the CPU clocks, and slows every
clock of the process (:mod:`_hide`): each call starts a thread for the matmul and joins it. An exited thread's CPU
time is no longer any thread's of the process (/proc/PID/task lists live ones), and the clocks the
harness could time calls with run 1000 times slow: the in-process figure is
tiny, and the CPU-time fallback counts only the main thread's waiting.

Expected to be stopped by: the time from outside, with the CPU time of every thread, exited ones
included (the cgroup's cpu.stat) (the outside figure).
"""

import torch
from torch import nn

CHEAT = True

if CHEAT:
    from _hide import in_exited_thread, slow_clocks  # beside this file (its folder is on the path)

    slow_clocks()


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not CHEAT:
            return torch.tanh(torch.mm(a, b))
        return in_exited_thread(lambda: torch.tanh(torch.mm(a, b)))
