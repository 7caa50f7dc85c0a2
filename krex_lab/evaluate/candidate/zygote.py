"""The zygote: a clean, warm parent that forks one process per candidate.

Started by a judge as ``python -m krex_lab.evaluate.candidate.zygote FD DEVICE`` (FD: its end of
a socketpair with the judge). It imports the frameworks once (torch, numpy) and never initialises
CUDA, never loads a candidate: every process it forks starts from that clean state, in a few
milliseconds instead of the seconds ``import torch`` takes. A forked spare makes its own CUDA
context while it waits (:func:`..candidate.process.serve`).

Requests (one line of text each, an fd riding along): ``fork`` with the child's channel socket ->
``forked <pid>``. When a child exits, ``exit <pid> <wait status>`` (the judge reads a crash's
signal from it). The zygote dies with its judge (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import os
import selectors
import signal
import socket
import sys

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _preload() -> None:
    import gc

    for name in ("numpy", "torch"):
        try:
            __import__(name)
        except Exception:
            pass
    from . import process  # noqa: F401  (what every child serves with, loaded once)
    from .sandbox import preload

    preload()

    # everything loaded so far lives as long as the children: frozen out of the collector's walks,
    # a collection in a candidate (one may land inside a timed call) walks the candidate's own
    # objects, not torch's million, and the children's pages stay shared with the zygote's
    gc.collect()
    gc.freeze()


def _child(ctl: socket.socket, fd: int, device: str) -> None:
    """In the forked child: its own session (the judge ends it with its whole group), then serve."""
    ctl.close()
    try:
        os.setsid()
        _die_with_parent()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a candidate's, as any program's
        from .process import serve
        from .sandbox import lock_process

        # now, while this process has one thread: every thread it will have (CUDA's, torch's,
        # the candidate's) is born inside the sandbox
        serve(fd, device, lock_process())
    finally:
        os._exit(0)


def main(argv: list[str]) -> None:
    # An interrupt is for a job, never for the zygote (it ends with its judge's socket or death)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # every candidate process starts as a copy of this one: no process of the user may read or
    # write its memory (a candidate that did would be in every later candidate's process)
    ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    fd, device = int(argv[0]), argv[1]
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:
        return
    ctl = socket.socket(fileno=fd)
    _preload()
    # the judge's own stdout is its job's: nothing forked from here may write there
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1):
        os.dup2(null, target)
    os.close(null)
    sel = selectors.DefaultSelector()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel.register(ctl, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    ctl.sendall(b"ready\n")
    while True:
        for key, _ in sel.select():
            if key.fileobj == wake_r:
                os.read(wake_r, 512)
                continue
            msg, fds, _flags, _addr = socket.recv_fds(ctl, 64, 4)
            if not msg:
                return
            if msg.startswith(b"fork") and fds:
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    signal.set_wakeup_fd(-1)
                    _child(ctl, fds[0], device)
                for f in fds:
                    os.close(f)
                ctl.sendall(f"forked {pid}\n".encode())
            else:
                for f in fds:
                    os.close(f)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            ctl.sendall(f"exit {pid} {status}\n".encode())


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ConnectionError:  # its judge's end of the socket went with the judge: no traceback
        pass
