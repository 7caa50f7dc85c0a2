"""Synchronise this process's GPU work, whichever framework started it.

Used when a region starts (leftovers of a previous cell must not land inside the timing) and
when the arbiter asks a KREX-aware session to drain. Only frameworks already imported *and*
initialised are touched: this never creates a CUDA context.
"""

from __future__ import annotations

import sys
from typing import Any


def _imported(name: str) -> Any:
    """``sys.modules[name]`` once its import has finished; None while absent or still running.

    This runs on the session's control thread (a drain) while the main thread may be importing
    a framework. Importing from here, or touching a module still being initialised, races the
    main thread's import: Python's import locks then hand one side a partial module or a
    ``_DeadlockError``, and the framework stays broken in that process (a warm worker's
    ``numba.cuda`` lost its submodules for every later job: H200, 2026-12-01)."""
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


def synchronize_frameworks() -> list[str]:
    """Wait for the device work of torch, CuPy and numba.cuda, where in use. Returns their names.

    Never imports anything, so it is safe on any thread at any time."""
    done: list[str] = []
    torch = _imported("torch")
    if torch is not None:
        try:
            if _imported("torch.cuda") is not None and torch.cuda.is_initialized():
                torch.cuda.synchronize()
                done.append("torch")
        except Exception:
            pass
    cupy = _imported("cupy")
    if cupy is not None and _imported("cupy.cuda.runtime") is not None:
        try:
            cupy.cuda.runtime.deviceSynchronize()
            done.append("cupy")
        except Exception:
            pass
    ctx = numba_context()
    if ctx is not None:
        try:
            # cuCtxSynchronize waits for the calling thread's current context, and a drain runs on
            # the control thread, where numba's context is not current: make it so for the call.
            ctx.push()
            try:
                ctx.synchronize()
            finally:
                ctx.pop()
            done.append("numba")
        except Exception:
            pass
    return done


def numba_free_pending(ctx: Any) -> None:
    """Carry out the frees numba has queued in context ``ctx``: its own queue (streams, events,
    modules) and its memory manager's, where a device array's free waits until ten of them (numba's
    ``CUDA_DEALLOCS_COUNT``) or a fifth of the GPU's memory are pending. Clearing only the
    context's queue left a job's arrays allocated: the pool recycled a worker after most agent
    study jobs on the H200 (2026-12-02), its memory a few hundred MiB above the baseline."""
    ctx.deallocations.clear()
    manager = getattr(ctx, "memory_manager", None)
    queue = getattr(manager, "deallocations", None)
    if queue is not None and queue is not ctx.deallocations:
        queue.clear()


def numba_context() -> Any:
    """numba's current CUDA context if one exists (never creates one, never imports; None in the
    simulator or while numba.cuda is being imported).

    Read from the driver object's own ``devices`` table and each device's ``primary_context``,
    both set in their ``__init__`` and read through ``vars()``: numba's ``Driver`` and ``Device``
    answer any other attribute with a driver call (``cuInit``, ``cuDeviceGetAttribute``), which a
    drain must never make. (``cuda.gpus.lst`` was read before: numba-cuda caches it in a
    ``functools.cache`` rather than the instance, so no context was ever found on the H200,
    2026-12-01.)"""
    cuda = _imported("numba.cuda")
    drivermod = _imported("numba.cuda.cudadrv.driver")
    if cuda is None or drivermod is None or hasattr(cuda, "FakeCUDAKernel"):  # the simulator's API
        return None
    try:
        devices = vars(vars(drivermod)["driver"]).get("devices") or {}
        for dev in list(devices.values()):
            ctx = vars(dev).get("primary_context")
            if ctx is not None:
                return ctx
    except Exception:  # another numba's layout: no cooperative sync (the driver lock still drains)
        return None
    return None
