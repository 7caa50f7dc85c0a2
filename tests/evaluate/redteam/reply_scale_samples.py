"""Patches the statistics on their way out: the channel's ``send`` in the candidate's own process
divides every timed sample by 50 before the round's answer leaves (each call still a few
microseconds or more, above the floor under which a CPU figure is disbelieved). The work itself
is honest.

Expected to be stopped by: the time from outside the candidate (the outside figure): the candidate's own
samples are never the verdict's figure unless they agree with the judge's.
"""

import sys

import msgspec
import torch
from torch import nn

CHEAT = True
SCALE = 50.0


def _install():
    channel = sys.modules.get("krex_lab.evaluate.channel")
    if channel is None:
        return
    real = channel.Channel.send

    def send(self, body, shared=None):
        if body.op == "timed" and body.samples:
            body = msgspec.structs.replace(body, samples=[s / SCALE for s in body.samples])
        return real(self, body, shared)

    channel.Channel.send = send


if CHEAT:
    _install()


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.mm(a, b))
