"""Foreign GPU processes for a benchmark to run beside: N processes, no KREX sessions, each
holding X GiB of the GPU (``torch.empty`` on the device; NVML lists them with their memory), idle
or looping matmuls (``busy``). On the fake backend they hold simulated memory where
``$KREX_FAKE_GPU_MEMORY`` is set (:mod:`krex_lab.gpu.fake`), else nothing.

    with foreign_processes(3, 20.0, backend="nvidia") as procs:
        ...  # procs: [{"pid", "gib", "busy", "held_gib"}]
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

_HOLDER = r"""
import os, sys, time
gib, busy, backend = float(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
nbytes = int(gib * (1 << 30))
if backend == "nvidia":
    import torch
    held = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    held.fill_(1)
    torch.cuda.synchronize()
    print("held", torch.cuda.memory_reserved() / 2**30, flush=True)
    if busy:
        a = torch.randn(4096, 4096, device="cuda")
        while True:
            for _ in range(50):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
    while True:
        time.sleep(60)
else:
    from krex_lab.gpu.fake import SimulatedMemory
    memory = SimulatedMemory.from_env()
    if memory is not None:
        memory.hold(int(os.environ.get("KREX_GPU", "0") or 0), nbytes)
    print("held", gib if memory is not None else 0.0, flush=True)
    while True:
        time.sleep(60)
"""


@contextlib.contextmanager
def foreign_processes(
    count: int, gib: float, *, backend: str, busy: bool = False, env: dict[str, str] | None = None
) -> Iterator[list[dict[str, Any]]]:
    """``count`` foreign processes holding ``gib`` GiB each while the block runs (killed after)."""
    procs: list[subprocess.Popen[str]] = []
    described: list[dict[str, Any]] = []
    try:
        for _ in range(count):
            proc = subprocess.Popen(
                [sys.executable, "-c", _HOLDER, str(gib), "1" if busy else "0", backend],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
                start_new_session=True,  # no KREX session, no part of the benchmark's process group
            )
            procs.append(proc)
            assert proc.stdout is not None
            line = proc.stdout.readline().split()
            if not line or line[0] != "held":
                raise RuntimeError(f"a foreign process could not hold {gib} GiB (exit {proc.poll()})")
            described.append({"pid": proc.pid, "gib": gib, "busy": busy, "held_gib": float(line[1])})
        yield described
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
