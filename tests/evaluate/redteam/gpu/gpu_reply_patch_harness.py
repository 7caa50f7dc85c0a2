"""Rewrites the candidate harness's reply in its own process, on the GPU: each call returns an
empty device buffer at once (the event pair brackets nothing), and the harness's reply function,
patched, launches every pending matmul and synchronises just before the outputs are shared with
the judge.

Expected to be stopped by: outputs written into the judge's buffers inside the timed call
(the data path); the time from outside the candidate, all its GPU work drained (the outside figure).
"""

import sys

import torch
from torch import nn

CHEAT = True
pending = []


def _install():
    process = sys.modules.get("krex_lab.evaluate.candidate.process")
    if process is None:
        return False
    real = process.Candidate._reply_outputs

    def reply(self, op, outs, inputs, extra):
        while pending:
            a, b, out = pending.pop()
            torch.mm(a, b, out=out)
            out.tanh_()
        torch.cuda.synchronize()
        return real(self, op, outs, inputs, extra)

    process.Candidate._reply_outputs = reply
    return True


ACTIVE = CHEAT and _install()


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if ACTIVE:
            out = torch.empty(a.shape[0], b.shape[1], device=a.device)
            pending.append((a, b, out))
            return out
        return torch.tanh(torch.mm(a, b))
