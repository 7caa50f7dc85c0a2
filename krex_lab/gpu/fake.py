"""Simulated GPUs for machines without one (CI, laptops).

Its processes are the arbiter's registered sessions and its drain is the cooperative one;
everything else KREX does (signals, affinity, cgroups, ZeroMQ, Jupyter) stays real. Every
name it reports says "simulated", so it can never pass for a GPU.

Simulated memory: where ``$KREX_FAKE_GPU_MEMORY`` names a directory (:class:`SimulatedMemory`),
each GPU's total and what every process holds on it are read from there, so that admission by
GPU memory can be tested without a GPU. Any process (a KREX worker, a test's stand-in for a
foreign GPU process) says what it holds with :meth:`SimulatedMemory.hold`, or allocates through
:func:`simulated_allocation`, which fails as a framework's allocator does when the GPU is full.
What a process held stops counting when it exits. ``$KREX_FAKE_CONTEXT_MB`` is what each
worker's simulated context holds there from its start, as a CUDA context and its framework's
caches hold memory on a GPU while the worker idles (:func:`hold_context`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from .base import GpuBackend, GpuInfo, GpuProcess

__all__ = [
    "CONTEXT_ENV",
    "MEMORY_ENV",
    "FakeBackend",
    "SimulatedMemory",
    "SimulatedOutOfMemory",
    "hold_context",
    "simulated_allocation",
]

#: a directory describing the simulated GPUs' memory (see :class:`SimulatedMemory`)
MEMORY_ENV = "KREX_FAKE_GPU_MEMORY"
#: MiB a worker's simulated context holds while it lives (see :func:`hold_context`)
CONTEXT_ENV = "KREX_FAKE_CONTEXT_MB"


class SimulatedOutOfMemory(RuntimeError):
    """A simulated allocation that does not fit; its message reads as CUDA's own does."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's, or a sandboxed caller's (signals refused): /proc says
        pass
    try:  # a zombie holds no memory
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class SimulatedMemory:
    """The memory of simulated GPUs, as files in one directory: ``gpu<N>.total`` (bytes) and
    ``gpu<N>.<pid>`` (bytes that process holds on GPU N). Files of processes that have exited
    are not counted."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)

    @classmethod
    def from_env(cls) -> SimulatedMemory | None:
        where = os.environ.get(MEMORY_ENV)
        return cls(where) if where else None

    def set_total(self, gpu: int, nbytes: int) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write(self.dir / f"gpu{gpu}.total", nbytes)

    def total(self, gpu: int, default: int) -> int:
        try:
            return int((self.dir / f"gpu{gpu}.total").read_text())
        except (OSError, ValueError):
            return default

    def hold(self, gpu: int, nbytes: int, pid: int | None = None) -> None:
        """Process ``pid`` (default: this one) holds ``nbytes`` on ``gpu`` from now (0: nothing)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"gpu{gpu}.{pid or os.getpid()}"
        if nbytes <= 0:
            path.unlink(missing_ok=True)
        else:
            self._write(path, nbytes)

    def held(self, gpu: int, pid: int | None = None) -> int:
        try:
            return int((self.dir / f"gpu{gpu}.{pid or os.getpid()}").read_text())
        except (OSError, ValueError):
            return 0

    def processes(self, gpu: int) -> dict[int, int]:
        """pid -> bytes, for every live process holding memory on ``gpu``."""
        out: dict[int, int] = {}
        with contextlib.suppress(OSError):
            for entry in self.dir.iterdir():
                name, _, pid = entry.name.partition(".")
                if name != f"gpu{gpu}" or not pid.isdigit() or not _alive(int(pid)):
                    continue
                with contextlib.suppress(OSError, ValueError):
                    out[int(pid)] = int(entry.read_text())
        return out

    def used(self, gpu: int) -> int:
        return sum(self.processes(gpu).values())

    @staticmethod
    def _write(path: Path, nbytes: int) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(str(int(nbytes)))
        os.replace(tmp, path)  # a reader sees the old figure or the new one, never half


#: the most this process held at once through :func:`simulated_allocation` (reset by the caller)
_peak = {"now": 0, "peak": 0}


def simulated_peak(reset: bool = False) -> int:
    """The most this process has held through :func:`simulated_allocation` (since the last reset)."""
    peak = _peak["peak"]
    if reset:
        _peak["peak"] = _peak["now"]
    return peak


@contextlib.contextmanager
def simulated_allocation(nbytes: int, gpu: int | None = None) -> Iterator[None]:
    """Hold ``nbytes`` more of simulated GPU memory for the block; raise
    :class:`SimulatedOutOfMemory` (CUDA's words, with this process's own figures) when they do not
    fit beside what every process holds. Nothing is simulated without ``$KREX_FAKE_GPU_MEMORY``."""
    memory = SimulatedMemory.from_env()
    if memory is None:
        yield
        return
    if gpu is None:
        gpu = int(os.environ.get("KREX_GPU", "0") or 0)
    total = memory.total(gpu, 80 << 30)
    used = memory.used(gpu)
    if used + nbytes > total:
        raise SimulatedOutOfMemory(
            f"CUDA out of memory. Tried to allocate {nbytes / 2**30:.2f} GiB. GPU {gpu} has a total capacity of "
            f"{total / 2**30:.2f} GiB of which {max(0, total - used) / 2**30:.2f} GiB is free. Of the allocated "
            f"memory {_peak['now'] / 2**30:.2f} GiB is allocated by PyTorch (simulated GPU)"
        )
    _peak["now"] += nbytes
    _peak["peak"] = max(_peak["peak"], _peak["now"])
    memory.hold(gpu, memory.held(gpu) + nbytes)
    try:
        yield
    finally:
        _peak["now"] -= nbytes
        memory.hold(gpu, max(0, memory.held(gpu) - nbytes))


def hold_context(gpu: int) -> int:
    """This process (a worker on simulated GPU ``gpu``) holds ``$KREX_FAKE_CONTEXT_MB`` there from
    now until it exits, as a real worker's CUDA context does; returns the bytes (0: none)."""
    memory = SimulatedMemory.from_env()
    mb = os.environ.get(CONTEXT_ENV, "")
    if memory is None or not mb.isdigit() or not int(mb):
        return 0
    memory.hold(gpu, memory.held(gpu) + (int(mb) << 20))
    return int(mb) << 20


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
        memory = SimulatedMemory.from_env()
        return [
            GpuInfo(
                index=i,
                name=f"Simulated GPU {i} (fake backend)",
                uuid=f"FAKE-{i:04d}",
                memory_total=memory.total(i, self._memory) if memory else self._memory,
                memory_used=memory.used(i) if memory else 0,
                simulated=True,
            )
            for i in range(self._count)
        ]

    def processes(self, gpu: int) -> list[GpuProcess]:
        return []
