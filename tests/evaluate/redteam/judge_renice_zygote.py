"""Slows whoever judges it: renices every thread of the judge (its process's grandparent: the
zygote's parent) and the zygote (its parent) to 19, and keeps a thread of its own spinning (its
code compiled under another name, so that a look for threads running this file's code misses
it): a reference timed while this process can run gets a sliver of the core, and the judge keeps
its new nice value for the next candidate. (Unlike :mod:`judge_renice_spin` it renices the zygote,
the next candidates' parent, too.)

Expected to be stopped by: no setpriority on another process (the sandbox); where that cannot
hold, the judge's scheduling put back and the candidate rejected (``judge_rescheduled``).
"""

import os
import threading

import torch
from torch import nn

CHEAT = True


def _parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _renice(pid):
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), 19)
        except OSError:
            pass


# compiled under a name of its own: a look for threads running this file's code does not see it
_SPIN = compile("def spin():\n    x = 0\n    while True:\n        x += 1\n", "<sched>", "exec")

if CHEAT:
    zygote = os.getppid()
    _renice(zygote)
    _renice(_parent(zygote))
    _namespace: dict = {}
    exec(_SPIN, _namespace)
    threading.Thread(target=_namespace["spin"], daemon=True, name="sched").start()


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.mm(a, b))
