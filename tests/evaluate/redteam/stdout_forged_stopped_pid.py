"""Forges a phase marker naming a stopped process: it forks a child that stops itself, then
writes ``@krex-evaluate-phase@ check <child pid>`` to its stdout (and to its ancestors' fd 1). A
client that does not count the time of a phase whose process is stopped (frozen by another
region) then never sees the limit pass while this call runs on far past it."""

import os
import signal
import time

import torch
from torch import nn

CHEAT = True
SPEND = 10.0


def _write_everywhere(data: bytes) -> None:
    paths = ["/proc/self/fd/1"]
    pid = os.getppid()
    while pid > 1:
        paths.append(f"/proc/{pid}/fd/1")
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
    for path in paths:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError:
            pass


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = True

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if CHEAT and self.first:
            self.first = False
            child = os.fork()
            if child == 0:
                os.kill(os.getpid(), signal.SIGSTOP)
                os._exit(0)
            os.waitpid(child, os.WUNTRACED)
            try:
                for phase in ("load", "check", "time"):
                    _write_everywhere(f"\n@krex-evaluate-phase@ {phase} {child}\n".encode())
                end = time.monotonic() + SPEND
                while time.monotonic() < end:
                    torch.mm(a, b)
            finally:
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
        return torch.tanh(torch.mm(a, b))
