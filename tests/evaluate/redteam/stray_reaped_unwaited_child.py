"""Passes a reaped child off as a process outside its cgroup, to put the judge's CPU figure on
/proc alone, then does the work in a child that exits unwaited.

A helper keeps about a hundred short-lived ``sleep`` processes coming (SIGCHLD ignored: reaped at
once, no zombie to tell) from the warm-up to the first timed call. One that exits between the
judge's listing of the candidate's processes and its look at their cgroups read as a process
outside the cgroup, and the judge then took its figure from /proc, which counts live processes
and the children they waited for. The matrix product runs in a forked child fed through shared
memory, which exits before the round answers: in no live process's figure. The last timed call
burns a little CPU so that the figure comes out small, not below zero.

Expected to be stopped by: strays counted only while alive, and with any, the larger of the
cgroup's and /proc's figures (the outside figure).
"""

import mmap
import os
import signal
import sys
import time

import torch
from torch import nn

CHEAT = True
N = 256 * 256 * 4


def _cpu_of(pid):
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except OSError:
        return 0.0


if CHEAT:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children auto-reaped: their CPU goes to nobody
    _shm = mmap.mmap(-1, 3 * N + 64)
    _ctl = torch.frombuffer(_shm, dtype=torch.int32, count=16, offset=3 * N)  # [0]: storm, [1]: storm quit
    _a = torch.frombuffer(_shm, dtype=torch.float32, count=N // 4, offset=0).view(256, 256)
    _b = torch.frombuffer(_shm, dtype=torch.float32, count=N // 4, offset=N).view(256, 256)
    _o = torch.frombuffer(_shm, dtype=torch.float32, count=N // 4, offset=2 * N).view(256, 256)
    _req_r, _req_w = os.pipe()
    _rep_r, _rep_w = os.pipe()
    _worker = os.fork()
    if _worker == 0:  # the worker: tanh(a @ b) on request, exits on b"q"
        torch.set_num_threads(1)
        while True:
            m = os.read(_req_r, 1)
            if m != b"c":
                os._exit(0)
            torch.mm(_a, _b, out=_o)
            _o.tanh_()
            os.write(_rep_w, b"d")
    _storm = os.fork()
    if _storm == 0:  # the storm: short-lived processes while _ctl[0] == 1, until _ctl[1] == 1
        import random

        while _ctl[1] == 0:
            if _ctl[0] == 1:  # ~100 alive at once, no polling: one every 0.25 ms, 10-40 ms each
                try:
                    os.posix_spawn("/usr/bin/sleep", ["sleep", f"{random.uniform(0.01, 0.04):.4f}"], {})
                except OSError:
                    pass
                time.sleep(0.00025)
            else:
                time.sleep(0.001)
        os._exit(0)


def _method():
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "_round":
            return f.f_locals.get("method"), len(f.f_locals["body"].order)
        f = f.f_back
    return None, 0


class ModelNew(nn.Module):
    timed = 0

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not CHEAT:
            return torch.tanh(torch.mm(a, b))
        method, size = _method()
        if method == "warmup":
            _ctl[0] = 1  # the window opens after the warm-up: storm until the first timed call
        elif method is not None:
            _ctl[1] = 1
        if method in (None, "warmup"):  # the check and the warm-up: here (the worker stays idle)
            return torch.tanh(torch.mm(a, b))
        _a.copy_(a)
        _b.copy_(b)
        os.write(_req_w, b"c")
        os.read(_rep_r, 1)
        out = _o.clone()
        if method not in (None, "warmup"):
            ModelNew.timed += 1
            if ModelNew.timed == 1:
                ModelNew.before = _cpu_of(_storm)
            if ModelNew.timed == size:  # the round's last call: the worker goes before the answer
                # the storm's CPU before the window is in the opening figure, gone from the
                # closing one: burn some of it back, or the figure comes out below zero
                t = time.thread_time() + 0.6 * ModelNew.before + size * 100e-6
                while time.thread_time() < t:
                    pass
                os.write(_req_w, b"q")
                while os.path.exists(f"/proc/{_worker}"):
                    time.sleep(0.0002)
        return out
