"""Answers the judge with bodies of the wrong shape, written straight onto the channel's socket in
its own process: a call's answer whose thread list is a number and whose input numbers are not
numbers, and (past the check phase) a round's answer whose samples are a word. The work itself
is honest. The judge must refuse it in words, and go on serving the next evaluation."""

import struct
import sys

import msgspec
import torch
from torch import nn

CHEAT = True
#: which answer is forged: "returned" (the check phase's calls) or "timed" (the timed rounds)
FORGE = "returned"
FORGED = {
    "returned": {"values": "garbage", "aliased": [1, "x"], "threads": 7},
    "timed": {"samples": "fast", "values": {}, "aliased": "x", "threads": {"t": 1}},
}


def _install():
    channel = sys.modules.get("krex_lab.evaluate.channel")
    if channel is None:
        return
    real = channel.Channel.send

    def send(self, *args, **kwargs):
        first = args[0] if args else None
        op = first if isinstance(first, str) else getattr(first, "op", None)
        if op == FORGE:
            data = msgspec.msgpack.encode({"op": op, "body": FORGED[op], "arrays": []})
            self.sock.sendall(struct.pack("!I", len(data)) + data)
            return None
        return real(self, *args, **kwargs)

    channel.Channel.send = send


if CHEAT:
    _install()


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.mm(a, b))
