"""Moves its process out of the cgroup the judge placed it in (into the parent, as root may), and
hides the work as :mod:`thread_exit_slow_clock` does (a thread that exits, every clock slowed): a
judge that read only that cgroup's CPU time would see none of it.

Expected to be stopped by: no write to the cgroup tree from the sandbox (landlock: ``/sys`` is
read-only), and the judge's CPU figure from ``/proc`` for any process found outside its cgroup
(the outside figure).
"""

import os

import torch
from torch import nn

CHEAT = True


def _escape():
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
        for line in lines:
            hier, controllers, path = line.split(":", 2)
            roots = {"0": ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]}.get(hier, [])
            if "cpuacct" in controllers.split(","):
                roots = ["/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/cpu,cpuacct"]
            for root in roots:
                parent = os.path.dirname(root + path)
                if os.path.exists(os.path.join(parent, "cgroup.procs")):
                    with open(os.path.join(parent, "cgroup.procs"), "w") as f:
                        f.write(str(os.getpid()))
    except OSError:
        pass


if CHEAT:
    from _hide import in_exited_thread, slow_clocks  # beside this file (its folder is on the path)

    _escape()
    slow_clocks()


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not CHEAT:
            return torch.tanh(torch.mm(a, b))
        return in_exited_thread(lambda: torch.tanh(torch.mm(a, b)))
