"""Rewrites the channel's encoder in the candidate's own process: each call returns an empty
buffer at once, and ``encode_tree`` (as the harness imported it), patched, computes the answer
into each pending output when it is asked to encode it, after the call's clock has stopped.

Expected to be stopped by: outputs written into the judge's buffers inside the timed call
(the data path); the time from outside the candidate, its CPU time included (the outside figure).
"""

import sys

import torch
from torch import nn

CHEAT = True
pending = {}


def _install():
    process = sys.modules.get("krex_lab.evaluate.candidate.process")
    channel = sys.modules.get("krex_lab.evaluate.channel")
    if process is None or channel is None:
        return False
    real = channel.encode_tree

    def encode_tree(value, shared, inputs=None):
        job = pending.pop(id(value), None) if isinstance(value, torch.Tensor) else None
        if job is not None:
            a, b = job
            torch.mm(a, b, out=value)
            value.tanh_()
        return real(value, shared, inputs)

    process.encode_tree = encode_tree
    channel.encode_tree = encode_tree
    return True


ACTIVE = CHEAT and _install()


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if ACTIVE:
            out = torch.empty(a.shape[0], b.shape[1])
            pending[id(out)] = (a, b)
            return out
        return torch.tanh(torch.mm(a, b))
