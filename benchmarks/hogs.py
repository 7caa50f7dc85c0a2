"""Foreign GPU load for the benchmarks: processes that are no KREX session, each holding some GiB
of device memory and looping matmuls, as a neighbour's training job would.

    with foreign_hogs(3, gib=20):          # three of them on GPU 0, started and ready
        ...                                # measure beside them

Run as a script (``python benchmarks/hogs.py GIB``) it is one hog: it allocates, prints ``ready``
and loops until killed.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def hog_main(gib: float) -> None:
    import torch

    # the memory held: one block, touched so that it is resident (NVML counts it)
    held = torch.empty(int(gib * (1 << 30)) // 4, dtype=torch.float32, device="cuda").fill_(1.0)
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    (a @ b).sum().item()
    print("ready", flush=True)
    while True:
        for _ in range(4):
            a @ b
        torch.cuda.synchronize()
    del held  # never reached: the memory is held until the process is killed


@contextlib.contextmanager
def foreign_hogs(n: int, gib: float, gpu: int = 0, timeout: float = 120.0) -> Iterator[list[int]]:
    """``n`` hogs of ``gib`` GiB each on ``gpu``, ready before the body runs, killed after it (their
    pids are yielded). No hog attaches to KREX: the arbiter sees them through NVML only."""
    import os

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
    for var in ("KREX_ENDPOINT", "KREX_POOL_ENDPOINT", "KREX_REGION", "KREX_GPU"):
        env.pop(var, None)
    procs = [
        subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(gib)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(n)
    ]
    try:
        deadline = time.monotonic() + timeout
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()  # blocks until the hog holds its memory
            if line.strip() != "ready" or time.monotonic() > deadline:
                raise SystemExit(f"a foreign hog did not start (exit {p.poll()})")
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(30)


if __name__ == "__main__":
    hog_main(float(sys.argv[1]))
