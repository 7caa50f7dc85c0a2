"""Forges its clock and does each call's work in a thread that has exited before anything reads
a clock: an accounting of the process's live threads misses that work."""

import threading

import torch
from torch import nn

CHEAT = True

if CHEAT:
    from _slow_clocks import install  # beside this file (its folder is on the path)

    install()


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
