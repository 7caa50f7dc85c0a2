"""Run a KREX module as a child that ends with its parent: ``python -m krex_lab.serverext._guard PPID MODULE ARGS…``.

The server extension starts the embedded arbiter and the pool service through this: it asks
the kernel for ``SIGTERM`` when the parent (the Jupyter server) dies, however it dies, so a
killed server leaves no arbiter or pool behind (both handle ``SIGTERM`` by undoing what they
did: thaw, unlock, stop workers). Then it runs ``MODULE`` as ``__main__`` in this process.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the extension still stops us at shutdown
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        sys.exit(0)


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit("usage: python -m krex_lab.serverext._guard PARENT_PID MODULE [ARGS...]")
    parent, module, args = int(argv[0]), argv[1], argv[2:]
    _die_with_parent(parent)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
