"""Is the GPU throttled? SM clock and clocks-event reasons from NVML, judged per batch of samples.

A reading counts as throttled (nvbench's rule, with NVML as the clock source) when

* the SM clock is below ``threshold`` (default 75 %) of the reference clock (NVML's maximum SM
  clock, or the highest clock seen so far when NVML has no maximum), or
* NVML reports a slowdown reason: hardware slowdown, software or hardware thermal slowdown, or
  the hardware power brake. ``gpu_idle``, application clocks and the software power cap alone
  are not throttling (the power cap lowers the clock, which the clock rule judges).

:func:`throttle_cause` is pure (tests feed it readings); :class:`NvmlClocks` reads a device
through :class:`krex_lab.gpu.nvml.PynvmlApi`; :class:`ClockLog` summarises the readings.
"""

from __future__ import annotations

import collections
import functools
import time
from dataclasses import dataclass
from typing import Protocol, TypedDict

from ..gpu.nvml import CLOCK_EVENT_REASONS, decode_throttle_reasons

_BIT = {name: bit for bit, name in CLOCK_EVENT_REASONS}
#: clocks-event reasons that mean the GPU slowed itself down
SLOWDOWN_MASK = (
    _BIT["hw_slowdown"] | _BIT["sw_thermal_slowdown"] | _BIT["hw_thermal_slowdown"] | _BIT["hw_power_brake_slowdown"]
)
DEFAULT_THRESHOLD = 0.75


@dataclass(frozen=True)
class ClockReading:
    sm_mhz: int | None
    mem_mhz: int | None
    reasons: int | None
    t: float = 0.0


class ClockSource(Protocol):
    """What the harness reads once before and once after each batch."""

    reference_mhz: float | None

    def read(self) -> ClockReading: ...

    def close(self) -> None: ...


def throttle_cause(
    reading: ClockReading, reference_mhz: float | None, threshold: float = DEFAULT_THRESHOLD
) -> str | None:
    """Why ``reading`` counts as throttled, or None."""
    if reading.reasons is not None and reading.reasons & SLOWDOWN_MASK:
        return "+".join(decode_throttle_reasons(reading.reasons & SLOWDOWN_MASK))
    if reading.sm_mhz is not None and reference_mhz and reading.sm_mhz < threshold * reference_mhz:
        return f"sm_clock_below_{threshold:.0%}"
    return None


class _ClockSource(TypedDict):
    #: "nvml", or None where NVML was not usable (then nothing else is said)
    source: str | None


class ClockSummary(_ClockSource, total=False):
    """What the clocks did during a measurement (its ``clocks``): made by :meth:`ClockLog.summary`,
    shown by ``Measurement.to_dict`` and the result files."""

    readings: int
    reference_sm_mhz: float | None
    throttle_threshold: float
    #: clocks-event reason -> readings that showed it
    reasons_seen: dict[str, int]
    sm_mhz_min: int
    sm_mhz_median: int
    sm_mhz_max: int
    mem_mhz_min: int
    mem_mhz_max: int


class ClockLog:
    """Every reading of one measurement, summarised for :class:`~krex_lab.bench.Measurement.clocks`."""

    def __init__(self, source: ClockSource | None, threshold: float = DEFAULT_THRESHOLD) -> None:
        self.source = source
        self.threshold = threshold
        self.readings: list[ClockReading] = []
        self.reasons_seen: collections.Counter[str] = collections.Counter()
        self.max_seen = 0

    @property
    def reference_mhz(self) -> float | None:
        ref = self.source.reference_mhz if self.source is not None else None
        return ref or (float(self.max_seen) if self.max_seen else None)

    def read(self) -> ClockReading | None:
        if self.source is None:
            return None
        try:
            r = self.source.read()
        except Exception:  # a reading that fails once must not end the measurement
            return None
        self.readings.append(r)
        if r.sm_mhz:
            self.max_seen = max(self.max_seen, r.sm_mhz)
        if r.reasons:
            self.reasons_seen.update(decode_throttle_reasons(r.reasons))
        return r

    def cause(self, *readings: ClockReading | None) -> str | None:
        for r in readings:
            if r is not None:
                why = throttle_cause(r, self.reference_mhz, self.threshold)
                if why:
                    return why
        return None

    def summary(self) -> ClockSummary:
        if self.source is None:
            return ClockSummary(source=None)
        sm = sorted(r.sm_mhz for r in self.readings if r.sm_mhz is not None)
        mem = sorted(r.mem_mhz for r in self.readings if r.mem_mhz is not None)
        out = ClockSummary(
            source="nvml",
            readings=len(self.readings),
            reference_sm_mhz=self.reference_mhz,
            throttle_threshold=self.threshold,
            reasons_seen=dict(self.reasons_seen),
        )
        if sm:
            out["sm_mhz_min"], out["sm_mhz_median"], out["sm_mhz_max"] = sm[0], sm[len(sm) // 2], sm[-1]
        if mem:
            out["mem_mhz_min"], out["mem_mhz_max"] = mem[0], mem[-1]
        return out

    def close(self) -> None:
        """Nothing to release: sources are shared by every measurement of the process (NVML stays open)."""


class NvmlClocks:
    """SM/memory clocks and clocks-event reasons of NVML device ``index``."""

    def __init__(self, index: int) -> None:
        from ..gpu.nvml import PynvmlApi

        self.index = index
        self.api = PynvmlApi()
        self.reference_mhz: float | None = None
        try:
            import pynvml

            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.reference_mhz = float(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)) or None
        except Exception:
            self.reference_mhz = None

    def read(self) -> ClockReading:
        sm, mem = self.api.clocks(self.index)
        return ClockReading(sm, mem, self.api.clock_event_reasons(self.index), time.monotonic())

    def close(self) -> None:
        self.api.shutdown()


@functools.lru_cache(maxsize=16)
def nvml_index(uuid: str | None, fallback: int | None) -> int | None:
    """NVML's index of the device with ``uuid`` (``GPU-…`` or bare), else ``fallback``."""
    if not uuid:
        return fallback
    want = uuid.lower().removeprefix("gpu-")
    try:
        from ..gpu.nvml import PynvmlApi

        api = PynvmlApi()
    except Exception:
        return fallback
    try:
        for i in range(api.device_count()):
            if api.uuid(i).lower().removeprefix("gpu-") == want:
                return i
    except Exception:
        pass
    finally:
        api.shutdown()
    return fallback


@functools.lru_cache(maxsize=16)
def open_clocks(index: int | None) -> NvmlClocks | None:
    """NVML clocks of device ``index`` (one per device for the process), or None where NVML is not usable."""
    if index is None:
        return None
    try:
        clocks = NvmlClocks(index)
        clocks.read()
        return clocks
    except Exception:
        return None
