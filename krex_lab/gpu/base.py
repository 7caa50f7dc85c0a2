"""The GPU backend interface.

The arbiter (and its guardian, for undo) is the only caller. A backend answers three
questions: what GPUs are there (:meth:`GpuBackend.inventory`), which processes use a GPU
(:meth:`GpuBackend.processes`), and can it drain another process's GPU work
(:meth:`GpuBackend.lock` / :meth:`GpuBackend.unlock`). Backends that cannot lock say so in
:attr:`GpuBackend.capabilities`; the drain then stays cooperative and the region report says
which processes were not drained.

``lock`` and ``unlock`` block; the drain step calls them from worker threads under a
deadline of its own, never on a stopped process (the NVIDIA driver hangs on those).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TypedDict

from ..procutil import GONE

# Capabilities lives with the wire's types: a client reading the status table imports no backend.
from ..protocol import BackendDescription, Capabilities

__all__ = ["BackendDescription", "Capabilities", "GpuBackend", "GpuInfo", "GpuProcess"]


class GpuInfoDict(TypedDict):
    """A :class:`GpuInfo` as plain data."""

    index: int
    name: str
    uuid: str
    memory_total: int
    memory_used: int
    utilization_gpu: float | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    throttle_reasons: list[str]
    simulated: bool


@dataclass
class GpuInfo:
    index: int
    name: str
    uuid: str
    memory_total: int = 0
    memory_used: int = 0
    utilization_gpu: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    throttle_reasons: list[str] = field(default_factory=list)
    simulated: bool = False

    def to_dict(self) -> GpuInfoDict:
        return GpuInfoDict(
            index=self.index,
            name=self.name,
            uuid=self.uuid,
            memory_total=self.memory_total,
            memory_used=self.memory_used,
            utilization_gpu=self.utilization_gpu,
            sm_clock_mhz=self.sm_clock_mhz,
            mem_clock_mhz=self.mem_clock_mhz,
            throttle_reasons=list(self.throttle_reasons),
            simulated=self.simulated,
        )


@dataclass
class GpuProcess:
    pid: int
    gpu: int
    used_memory: int | None = None


class GpuBackend(abc.ABC):
    """A node's GPUs, as the arbiter sees them."""

    #: short name shown in logs and ``krex status`` ("nvidia", "amd", "fake")
    name: str = "?"
    #: True for the fake backend: every display of it says the GPUs are simulated
    simulated: bool = False

    @abc.abstractmethod
    def gpu_count(self) -> int: ...

    @abc.abstractmethod
    def inventory(self) -> list[GpuInfo]: ...

    @abc.abstractmethod
    def processes(self, gpu: int) -> list[GpuProcess]:
        """Processes with a context on ``gpu`` (host pids). The fake backend has none of its own."""

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            lock=False,
            reason="no driver lock here: KREX sessions are drained by asking them, other processes not at all",
        )

    def lock_check(self, pid: int, state: str | None, what: str, cgroups: dict[str, bool] | None = None) -> bool:
        """The checks :meth:`lock` and :meth:`unlock` make before their driver call, for a caller
        that makes them itself and then passes ``checked=True``.

        The drain calls this on its event loop for every target, with ``state`` (/proc/PID/stat's)
        read there already, so that its lock threads make nothing but driver calls: Python checks
        in 16 threads at once queue on the GIL (lock_cost.py, H200, 2026-12-01). Returns False if
        the process is gone; raises BackendError where the call would hang (``what``: "lock" or
        "unlock", for the message). ``cgroups``: what a batch of checks has learnt of cgroups so
        far (frozen or not), so that a cgroup shared by many targets is looked at once.
        """
        return state is not None and state not in GONE

    def lock(self, pid: int, timeout_s: float, checked: bool = False) -> str:
        """Block ``pid``'s next GPU call and wait for its submitted work. Raises BackendError.

        Returns what happened: ``"locked"`` (KREX must unlock it), or why nothing was needed:
        ``"already-locked"`` (someone else's lock: not ours to undo), ``"checkpointed"``,
        ``"not-cuda"`` (no context yet: look again later), ``"gone"``. ``checked``: the caller
        made :meth:`lock_check` just before.
        """
        raise NotImplementedError(self.capabilities.reason)

    def unlock(self, pid: int, checked: bool = False) -> None:
        """Undo :meth:`lock`. Must be safe on a process that has exited. ``checked`` as for lock."""
        raise NotImplementedError(self.capabilities.reason)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release library handles."""

    def describe(self) -> BackendDescription:
        """``backend``, ``simulated``, ``capabilities`` (and ``driver``, NVIDIA): the JSON body the arbiter
        spreads into its ``hello`` and ``register`` replies and its status table."""
        return BackendDescription(backend=self.name, simulated=self.simulated, capabilities=self.capabilities.to_dict())
