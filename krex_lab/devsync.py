"""Synchronise this process's GPU work, whichever framework started it.

Used when a region starts (leftovers of a previous cell must not land inside the timing) and
when the arbiter asks a KREX-aware session to drain. Only frameworks already imported *and*
initialised are touched: this never creates a CUDA context.
"""

from __future__ import annotations

import sys


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
    numba_cuda = sys.modules.get("numba.cuda")
    if numba_cuda is not None:
        try:
            # numba creates its context lazily per thread; only sync one that exists.
            from numba.cuda.cudadrv import devices

            if devices._runtime.gpus and getattr(devices._runtime, "_tls", None) is not None:
                ctx = devices.get_context()
                ctx.synchronize()
                done.append("numba")
        except Exception:
            pass
    return done
