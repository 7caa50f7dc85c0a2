"""The NVML side of the NVIDIA backend: inventory and process lists, through nvidia-ml-py.

:class:`NvmlApi` is the small interface the backend uses, indexed by NVML device index;
:class:`PynvmlApi` implements it over ``pynvml`` (imported when it is constructed, never at
``import krex_lab``). Tests substitute their own :class:`NvmlApi`.

Optional readings (utilisation, clocks, throttle reasons) are ``None`` where a GPU or driver
does not support them; a broken library (init, count, handles) raises BackendError.
"""

from __future__ import annotations

import abc
import contextlib
import threading
from typing import Any

from ..errors import BackendError

# nvmlClocksEventReason* / nvmlClocksThrottleReason* bits (nvml.h). The ABI is stable, so the
# table lives here and decoding stays a pure function that tests can check without NVML.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),  # also "user defined clocks"
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


def decode_throttle_reasons(mask: int) -> list[str]:
    """Names of the bits set in an NVML clocks-event mask; unknown bits as ``unknown_0x...``."""
    names = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]
    known = 0
    for bit, _ in CLOCK_EVENT_REASONS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"unknown_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return names


def _text(value: Any) -> str:
    # Older nvidia-ml-py returns bytes, newer returns str.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlApi(abc.ABC):
    """What the backend asks NVML. ``index`` is NVML's device index (PCI bus order)."""

    @abc.abstractmethod
    def shutdown(self) -> None: ...

    @abc.abstractmethod
    def device_count(self) -> int: ...

    @abc.abstractmethod
    def driver_version(self) -> str:
        """The kernel driver's version, e.g. ``"580.159.04"``."""

    @abc.abstractmethod
    def name(self, index: int) -> str: ...

    @abc.abstractmethod
    def uuid(self, index: int) -> str: ...

    @abc.abstractmethod
    def memory(self, index: int) -> tuple[int, int]:
        """(total, used) bytes."""

    @abc.abstractmethod
    def utilization(self, index: int) -> float | None:
        """Percent of the last sample period in which a kernel ran."""

    @abc.abstractmethod
    def clocks(self, index: int) -> tuple[int | None, int | None]:
        """Current (SM, memory) clocks in MHz."""

    @abc.abstractmethod
    def clock_event_reasons(self, index: int) -> int | None:
        """The clocks-event (throttle) reason mask."""

    @abc.abstractmethod
    def processes(self, index: int) -> list[tuple[int, int | None]]:
        """(pid as NVML reports it, used GPU memory in bytes or None), compute and graphics."""


class PynvmlApi(NvmlApi):
    """:class:`NvmlApi` over nvidia-ml-py. Raises BackendError when NVML cannot start."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise BackendError("nvidia-ml-py (pynvml) is missing: pip install 'krex-lab[nvidia]'") from exc
        self._nv: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise BackendError(f"NVML init failed: {exc}") from exc
        self._handles: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._open = True

    def shutdown(self) -> None:
        with self._lock:
            if self._open:
                self._open = False
                self._handles.clear()
                # Shutting down twice, or a lost driver: nothing left to release.
                with contextlib.suppress(self._nv.NVMLError):
                    self._nv.nvmlShutdown()

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            raise BackendError(f"NVML {what} failed: {exc}") from exc

    def _optional(self, fn: Any, *args: Any) -> Any:
        # Not every GPU (or vGPU, or MIG slice) reports every reading: absent is not an error.
        try:
            return fn(*args)
        except self._nv.NVMLError:
            return None

    def _handle(self, index: int) -> Any:
        with self._lock:
            handle = self._handles.get(index)
            if handle is None:
                handle = self._call(f"handle of GPU {index}", self._nv.nvmlDeviceGetHandleByIndex, index)
                self._handles[index] = handle
            return handle

    def device_count(self) -> int:
        return int(self._call("device count", self._nv.nvmlDeviceGetCount))

    def driver_version(self) -> str:
        return _text(self._call("driver version", self._nv.nvmlSystemGetDriverVersion))

    def name(self, index: int) -> str:
        return _text(self._call("device name", self._nv.nvmlDeviceGetName, self._handle(index)))

    def uuid(self, index: int) -> str:
        return _text(self._call("device uuid", self._nv.nvmlDeviceGetUUID, self._handle(index)))

    def memory(self, index: int) -> tuple[int, int]:
        info = self._optional(self._nv.nvmlDeviceGetMemoryInfo, self._handle(index))
        return (int(info.total), int(info.used)) if info is not None else (0, 0)

    def utilization(self, index: int) -> float | None:
        rates = self._optional(self._nv.nvmlDeviceGetUtilizationRates, self._handle(index))
        return float(rates.gpu) if rates is not None else None

    def clocks(self, index: int) -> tuple[int | None, int | None]:
        handle = self._handle(index)
        sm = self._optional(self._nv.nvmlDeviceGetClockInfo, handle, self._nv.NVML_CLOCK_SM)
        mem = self._optional(self._nv.nvmlDeviceGetClockInfo, handle, self._nv.NVML_CLOCK_MEM)
        return (int(sm) if sm is not None else None, int(mem) if mem is not None else None)

    def clock_event_reasons(self, index: int) -> int | None:
        handle = self._handle(index)
        # "Throttle reasons" were renamed "clocks event reasons" (driver 535+); same bits.
        for attr in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(self._nv, attr, None)
            if fn is not None:
                mask = self._optional(fn, handle)
                if mask is not None:
                    return int(mask)
        return None

    def processes(self, index: int) -> list[tuple[int, int | None]]:
        handle = self._handle(index)
        seen: dict[int, int | None] = {}
        # The compute list must answer: an empty list would let a drain skip real GPU work.
        # The graphics list is unsupported on compute-only GPUs, so it is optional.
        compute = self._call("compute processes", self._nv.nvmlDeviceGetComputeRunningProcesses, handle)
        graphics = self._optional(self._nv.nvmlDeviceGetGraphicsRunningProcesses, handle)
        for procs in (compute, graphics):
            for proc in procs or []:
                used = getattr(proc, "usedGpuMemory", None)  # None: NVML_VALUE_NOT_AVAILABLE
                pid = int(proc.pid)
                if pid not in seen or seen[pid] is None:
                    seen[pid] = int(used) if used is not None else None
        return sorted(seen.items())
