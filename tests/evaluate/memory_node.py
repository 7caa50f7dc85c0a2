"""A node of one simulated GPU with memory (the fake backend's :class:`SimulatedMemory`): a real
arbiter that reads it as NVML would, and a real pool whose judges and candidates allocate from it.
Shared by the admission tests."""

from __future__ import annotations

import io
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from krex_lab.gpu.fake import CONTEXT_ENV, MEMORY_ENV, SimulatedMemory
from krex_lab.pytest_plugin import running_arbiter
from tests.support.pool import PoolProc

GiB = 1 << 30


class Terminal(io.StringIO):
    """The progress line's stream, as a terminal (each change drawn there)."""

    def isatty(self) -> bool:
        return True


def memory_node(
    factory: pytest.TempPathFactory, total: int, workers: int = 1, context_mb: int = 0
) -> Iterator[SimpleNamespace]:
    """Yield ``SimpleNamespace(pool, memory, base)``: GPU 0 of ``total`` bytes, a pool of ``workers``
    (no spares), each worker's context holding ``context_mb`` MiB there while it lives."""
    base = factory.mktemp("memory-node")
    memory_dir = base / "gpu-memory"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(MEMORY_ENV, str(memory_dir))
        if context_mb:
            mp.setenv(CONTEXT_ENV, str(context_mb))
        mp.setenv("KREX_POOL_ENDPOINT", f"ipc://{base / 'rt' / 'pool.sock'}")
        mp.setenv("KREX_EVAL_CACHE", str(base / "cache"))
        memory = SimulatedMemory(memory_dir)
        memory.set_total(0, total)
        for arbiter in running_arbiter(base, mp, gpus=1):
            pool = PoolProc(
                arbiter.env(),
                f"ipc://{arbiter.runtime / 'pool.sock'}",
                "--Pool.preload=torch",
                f"--workers-per-gpu={workers}",
                "--spares=0",
                "--Pool.interrupt_grace=1.0",
                log=arbiter.runtime / "pool.log",
            )
            pool.start(240)
            try:
                yield SimpleNamespace(pool=pool, memory=memory, base=base)
            finally:
                pool.stop()
