"""Never returns, and cannot be interrupted: it ignores SIGINT and spins (as a process waiting on
a GPU kernel that never ends sits in the driver). Only killing its worker ends it."""

import signal

from torch import nn


class ModelNew(nn.Module):
    def forward(self, x):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:
            pass
