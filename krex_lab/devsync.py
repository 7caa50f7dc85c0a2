"""Synchronise this process's GPU work, whichever framework started it.

Used when a region starts (leftovers of a previous cell must not land inside the timing) and
when the arbiter asks a KREX-aware session to drain. Only frameworks already imported *and*
initialised are touched: this never creates a CUDA context.
"""

from __future__ import annotations

import sys
from typing import Any


def synchronize_frameworks() -> list[str]:
    """Wait for the device work of torch, CuPy and numba.cuda, where in use. Returns their names."""
    done: list[str] = []
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
                done.append("torch")
        except Exception:
            pass
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            cupy.cuda.runtime.deviceSynchronize()
            done.append("cupy")
        except Exception:
            pass
    ctx = numba_context()
    if ctx is not None:
        try:
            ctx.synchronize()
            done.append("numba")
        except Exception:
            pass
    return done


def numba_context() -> Any:
    """numba's current CUDA context if one exists (never creates one; None in the simulator)."""
    if "numba.cuda" not in sys.modules:
        return None
    try:
        from numba import config

        if getattr(config, "ENABLE_CUDASIM", False):
            return None
        from numba.cuda.cudadrv import devices

        gpus = devices._runtime.gpus
        if "lst" not in vars(gpus):  # numba never looked at the devices: no context
            return None
        for dev in gpus.lst:
            ctx = getattr(dev._device, "primary_context", None)
            if ctx is not None:
                return ctx
    except Exception:
        return None
    return None
