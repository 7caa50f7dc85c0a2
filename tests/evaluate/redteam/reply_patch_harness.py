"""Rewrites the candidate harness's reply in its own process: each call returns an empty buffer at
once (the call's clock sees nothing), and the harness's reply function, patched, fills every
pending output with the right answer just before the outputs are encoded for the judge (after
the clock has stopped).

Expected to be stopped by: outputs written into the judge's buffers inside the timed call
(the data path); the time from outside the candidate, its CPU time included (the outside figure).
"""

import sys

import torch
from torch import nn

CHEAT = True
pending = []


def _install():
    process = sys.modules.get("krex_lab.evaluate.candidate.process")
    if process is None:
        return
    real = process.Candidate._reply_outputs

    def reply(self, op, outs, inputs, extra):
        while pending:
            a, b, out = pending.pop()
            torch.mm(a, b, out=out)
            out.tanh_()
        return real(self, op, outs, inputs, extra)

    process.Candidate._reply_outputs = reply


if CHEAT:
    _install()


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if CHEAT and pending is not None and "krex_lab.evaluate.candidate.process" in sys.modules:
            out = torch.empty(a.shape[0], b.shape[1])
            pending.append((a, b, out))
            return out
        return torch.tanh(torch.mm(a, b))
