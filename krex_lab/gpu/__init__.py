"""GPU backends: ``nvidia`` (NVML + the driver's checkpoint lock), ``amd`` (amdsmi), ``fake``, and
any a package registers (:mod:`.vendors`, which also knows how each vendor places a process).

:func:`make_backend` is the one place that chooses; ``auto`` tries NVML, then amdsmi, then
falls back to the fake backend and says so in the log. Vendor libraries are imported lazily.
"""

from __future__ import annotations

import logging

from .base import Capabilities, GpuBackend, GpuInfo, GpuProcess

__all__ = ["FAKE_GPUS", "Capabilities", "GpuBackend", "GpuInfo", "GpuProcess", "make_backend"]

#: simulated GPUs of the fake backend unless ``--fake-gpus`` says otherwise: the one default of
#: ``krex arbiter``, ``krex lab`` and the extension's embedded arbiter (two, so that a notebook
#: can show work on another GPU than its kernel's)
FAKE_GPUS = 2
log = logging.getLogger("krex.gpu")


def make_backend(kind: str = "auto", fake_gpus: int = FAKE_GPUS, quiet: bool = False) -> GpuBackend:
    """The backend ``kind`` names (:mod:`.vendors` knows them); ``auto``: each real one in turn, else
    the fake one, with a warning unless ``quiet`` (a caller whose own start-up line says which
    backend it got and why)."""
    from .vendors import FAKE, vendor, vendors

    if kind != "auto":
        chosen = vendor(kind)  # ValueError naming the known backends
        return chosen.load(gpus=fake_gpus) if chosen.simulated else chosen.load()
    for candidate in vendors().values():
        if not candidate.auto:
            continue
        try:
            return candidate.load()
        except Exception as exc:
            log.debug("no %s GPU: %s", candidate.name, exc)
    if not quiet:
        log.warning("no GPU library answered: using the FAKE backend with %d simulated GPU(s)", fake_gpus)
    return FAKE.load(gpus=fake_gpus)
