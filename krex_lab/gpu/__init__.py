"""GPU backends: ``nvidia`` (NVML + the driver's checkpoint lock), ``amd`` (amdsmi), ``fake``.

:func:`make_backend` is the one place that chooses; ``auto`` tries NVML, then amdsmi, then
falls back to the fake backend and says so in the log. Vendor libraries are imported lazily.
"""

from __future__ import annotations

import logging

from .base import Capabilities, GpuBackend, GpuInfo, GpuProcess

__all__ = ["BACKENDS", "FAKE_GPUS", "Capabilities", "GpuBackend", "GpuInfo", "GpuProcess", "make_backend"]

BACKENDS = ("auto", "nvidia", "amd", "fake")
#: simulated GPUs of the fake backend unless ``--fake-gpus`` says otherwise: the one default of
#: ``krex arbiter``, ``krex lab`` and the extension's embedded arbiter (two, so that a notebook
#: can show work on another GPU than its kernel's)
FAKE_GPUS = 2
log = logging.getLogger("krex.gpu")


def make_backend(kind: str = "auto", fake_gpus: int = FAKE_GPUS, quiet: bool = False) -> GpuBackend:
    """The backend ``kind`` names; ``auto``: NVIDIA, else AMD, else the fake one, with a warning unless
    ``quiet`` (a caller whose own start-up line says which backend it got and why)."""
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

    if kind == "auto" and not quiet:
        log.warning("no GPU library answered: using the FAKE backend with %d simulated GPU(s)", fake_gpus)
    return FakeBackend(fake_gpus)
