"""Does the work in a forked child fed through shared memory and has it exit before each round
answers (a new one for the next), never waiting for it: it stays a zombie, which no live process's
/proc figure counts, and no parent has reaped it into its children's figure.

Expected to be stopped by: the candidate's cgroup (it counts the child), or without one, the
rounds' wall time as the least the figure can be (the outside figure).
"""

import mmap
import os
import sys

import torch
from torch import nn

CHEAT = True
N = 256 * 256 * 4


def _worker(req, rep, a, b, o):
    torch.set_num_threads(1)
    while os.read(req, 1) == b"c":
        torch.mm(a, b, out=o)
        o.tanh_()
        os.write(rep, b"d")
    os._exit(0)


def _start():
    shm = mmap.mmap(-1, 3 * N)
    a, b, o = (torch.frombuffer(shm, dtype=torch.float32, count=N // 4, offset=i * N).view(256, 256) for i in range(3))
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _worker(req_r, rep_w, a, b, o)
    return pid, req_w, rep_r, a, b, o


def _state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _round_size():
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "_round":
            return f.f_locals.get("method"), len(f.f_locals["body"].order)
        f = f.f_back
    return None, 0


class ModelNew(nn.Module):
    state = None
    calls = 0

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        method, size = _round_size()
        if not CHEAT or method in (None, "warmup"):
            return torch.tanh(torch.mm(a, b))
        if ModelNew.state is None:
            ModelNew.state = _start()
        pid, req, rep, sa, sb, so = ModelNew.state
        sa.copy_(a)
        sb.copy_(b)
        os.write(req, b"c")
        os.read(rep, 1)
        out = so.clone()
        ModelNew.calls += 1
        if ModelNew.calls % size == 0:  # the round's last call: the child goes before the answer
            os.write(req, b"q")
            while _state(pid) != "Z":
                os.sched_yield()  # a zombie now, and left one
            ModelNew.state = None
        return out
