"""GPU backends: ``nvidia`` (NVML + the driver's checkpoint lock), ``amd`` (amdsmi), ``fake``.

:func:`make_backend` is the one place that chooses; ``auto`` tries NVML, then amdsmi, then
falls back to the fake backend and says so in the log. Vendor libraries are imported lazily.
"""

from __future__ import annotations

import logging

from .base import Capabilities, GpuBackend, GpuInfo, GpuProcess

__all__ = ["BACKENDS", "Capabilities", "GpuBackend", "GpuInfo", "GpuProcess", "make_backend"]

BACKENDS = ("auto", "nvidia", "amd", "fake")
log = logging.getLogger("krex.gpu")


def make_backend(kind: str = "auto", fake_gpus: int = 1) -> GpuBackend:
    if kind not in BACKENDS:
        raise ValueError(f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")
    if kind in ("nvidia", "auto"):
        try:
            from .nvidia import NvidiaBackend

            return NvidiaBackend()
        except Exception as exc:
            if kind == "nvidia":
                raise
            log.debug("no NVIDIA GPU: %s", exc)
    if kind in ("amd", "auto"):
        try:
            from .amd import AmdBackend

            return AmdBackend()
        except Exception as exc:
            if kind == "amd":
                raise
            log.debug("no AMD GPU: %s", exc)
    from .fake import FakeBackend

    if kind == "auto":
        log.warning("no GPU library answered: using the FAKE backend with %d simulated GPU(s)", fake_gpus)
    return FakeBackend(fake_gpus)
