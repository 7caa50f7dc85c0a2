"""Two copies of this file judged at once, in one batch, collude: the first to start becomes a
co-processor for the second. It creates a file in ``/dev/shm`` (shared by every process of the
user, and writable from the sandbox) and, still importing (its load phase, which nobody times),
serves requests there: the input in, the answer out, with a futex on the shared page to wait
without spinning. The second copy finds the file, and each of its calls copies its inputs there
and sleeps until the answer is written: the work's CPU time is charged to the other
evaluation's process, its own cgroup counts only the copies. Where the other copy does not
answer (it is frozen: a region of its GPU), the call computes its answer itself.

Expected to be stopped by: a CPU-timed case holding every GPU's region of the node, so that the
co-processor, judged on another GPU, is frozen while its client is timed (the calls then compute
their own answers); on a GPU, the judge's bracket of the round, which counts the wait (the outside
figure).
"""

import ctypes
import mmap
import os
import time

import torch
from torch import nn

CHEAT = True
N = 1024
PATH = "/dev/shm/krexrt-collude"
HEAD = 64  # [0] requests made, [1] requests answered (futex words)
SIZE = HEAD + 2 * N * 4
FIRST_S = 20.0  # waits this long for a client, then stops once unasked for IDLE_S
IDLE_S = 20.0
_libc = ctypes.CDLL(None, use_errno=True)
_SYS_FUTEX, _WAIT, _WAKE = 202, 0, 1  # x86-64; a shared page: no FUTEX_PRIVATE_FLAG


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _wait(word, seen, seconds):
    ts = _Timespec(int(seconds), int(seconds % 1 * 1e9))
    _libc.syscall(_SYS_FUTEX, ctypes.byref(word), _WAIT, seen, ctypes.byref(ts), None, 0)


def _wake(word):
    _libc.syscall(_SYS_FUTEX, ctypes.byref(word), _WAKE, 1, None, None, 0)


def _work(x):
    return torch.tanh(torch.outer(x, x)).sum(1)


class _Shared:
    def __init__(self, fd):
        self.mm = mmap.mmap(fd, SIZE)
        os.close(fd)
        self.asked = ctypes.c_int.from_buffer(self.mm, 0)
        self.done = ctypes.c_int.from_buffer(self.mm, 4)
        flat = torch.frombuffer(self.mm, dtype=torch.float32, offset=HEAD)
        self.x, self.out = flat[:N], flat[N : 2 * N]


def _serve(sh):
    torch.set_num_threads(1)
    last = time.monotonic()
    answered = 0
    while time.monotonic() - last < (IDLE_S if answered else FIRST_S):
        _wait(sh.asked, answered, 0.5)
        if sh.asked.value != answered:
            sh.out.copy_(_work(sh.x))
            answered = sh.done.value = sh.asked.value
            _wake(sh.done)
            last = time.monotonic()


def _role():
    """The co-processor (it serves here, then None) or the client (the shared memory)."""
    try:
        fd = os.open(PATH, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _Shared(os.open(PATH, os.O_RDWR))
    os.ftruncate(fd, SIZE)
    try:
        _serve(_Shared(fd))
    finally:
        os.unlink(PATH)
    return None


shared = _role() if CHEAT else None


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sh = shared
        if sh is not None and x.shape == (N,):
            sh.x.copy_(x)
            want = sh.asked.value + 1
            sh.asked.value = want
            _wake(sh.asked)
            deadline = time.monotonic() + 0.2
            while sh.done.value != want and time.monotonic() < deadline:
                _wait(sh.done, sh.done.value, 0.05)
            if sh.done.value == want:
                return sh.out.clone()
        return _work(x)
