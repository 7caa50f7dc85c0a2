"""Simulated GPUs for machines without one (CI, laptops).

Its processes are the arbiter's registered sessions and its drain is the cooperative one;
everything else KREX does (signals, affinity, cgroups, ZeroMQ, Jupyter) stays real. Every
name it reports says "simulated", so it can never pass for a GPU.
"""

from __future__ import annotations

from .base import GpuBackend, GpuInfo, GpuProcess


class FakeBackend(GpuBackend):
    name = "fake"
    simulated = True

    def __init__(self, gpus: int = 1, memory_gib: int = 80) -> None:
        if gpus < 1:
            raise ValueError("the fake backend needs at least one GPU")
        self._count = gpus
        self._memory = memory_gib << 30

    def gpu_count(self) -> int:
        return self._count

    def inventory(self) -> list[GpuInfo]:
        return [
            GpuInfo(
                index=i,
                name=f"Simulated GPU {i} (fake backend)",
                uuid=f"FAKE-{i:04d}",
                memory_total=self._memory,
                simulated=True,
            )
            for i in range(self._count)
        ]

    def processes(self, gpu: int) -> list[GpuProcess]:
        return []
