"""Forges the evaluator's phase marker: before a slow first call it writes
``@krex-evaluate-phase@ done <pid>`` (with its own pid, its parent's, and every hex token found in
its own and its ancestors' environment and command line, in case the marker carries a nonce) to
fd 1, to every pipe or socket it holds, and to /proc/<ancestor>/fd/1 of its krex ancestors. A
client that takes the line for the end of the job stops counting the phase's time limit, and the
call then takes far longer than the limit allows."""

import os
import re
import time

import torch
from torch import nn

CHEAT = True
SPEND = 10.0  # seconds: several times the phase limit the test gives


def _ancestors():
    pid = os.getppid()
    while pid > 1:
        yield pid
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return


def _lines() -> bytes:
    tokens = {""}
    for pid in ("self", *map(str, _ancestors())):
        for what in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{what}", "rb") as f:
                    tokens |= {t.decode() for t in re.findall(rb"\b[0-9a-f]{16,64}\b", f.read())}
            except OSError:
                pass
    pids = [os.getpid(), os.getppid()]
    lines = [f"@krex-evaluate-phase@ done {pid}" for pid in pids]
    lines += [f"@krex-evaluate-phase@ {t} done {pid}" for t in tokens if t for pid in pids]
    lines += [f"@krex-evaluate-phase@ done {pid} {t}" for t in tokens if t for pid in pids]
    return ("\n" + "\n".join(lines) + "\n").encode()


def _forge() -> None:
    data = _lines()
    targets = ["/proc/self/fd/" + fd for fd in os.listdir("/proc/self/fd")]
    targets += [f"/proc/{pid}/fd/1" for pid in _ancestors()]
    for path in targets:
        try:
            kind = os.readlink(path)
            if kind.startswith(("pipe:", "socket:", "/dev/pts", "/dev/tty")) or path.endswith("/fd/1"):
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                try:
                    os.write(fd, data)
                finally:
                    os.close(fd)
        except OSError:
            pass
    try:
        os.write(1, data)
    except OSError:
        pass


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = True

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if CHEAT and self.first:
            self.first = False
            _forge()
            end = time.monotonic() + SPEND
            while time.monotonic() < end:
                torch.mm(a, b)
        return torch.tanh(torch.mm(a, b))
