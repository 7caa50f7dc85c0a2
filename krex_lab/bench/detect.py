"""Which framework a call runs on: from its arguments, the callable, or what its closure holds.

:func:`detect` answers ``torch``, ``cupy``, ``numba`` or ``host`` for :mod:`.frameworks`, whose
adapter then times the call; nothing here imports a framework that the process has not imported.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["detect", "kind_of", "numba_simulator", "unwrap"]


def _module_of(obj: Any) -> str:
    return type(obj).__module__ or ""


def kind_of(value: Any) -> str | None:
    """The framework an array belongs to ("host" for NumPy and CPU tensors; None: not an array)."""
    mod = _module_of(value)
    if mod.startswith("torch"):
        return "torch" if getattr(value, "is_cuda", False) else "host"
    if mod.startswith("cupy"):
        return "cupy"
    if mod.startswith("numba.cuda"):
        return "numba"
    if mod.startswith("numpy"):
        return "host"
    return None


def unwrap(fn: Any) -> tuple[Any, list[Any]]:
    """The innermost callable of ``functools.partial`` layers and the arguments they bind."""
    bound: list[Any] = []
    while isinstance(fn, functools.partial):
        bound += [*fn.args, *fn.keywords.values()]
        fn = fn.func
    return fn, bound


def numba_simulator() -> bool:
    """Whether numba.cuda is (or, once imported, will be) its CUDA simulator."""
    cuda = sys.modules.get("numba.cuda")
    if cuda is not None:  # decided when numba.cuda was imported, whatever the config says now
        return hasattr(cuda, "FakeCUDAKernel")
    if "numba" in sys.modules:
        try:
            from numba import config

            return bool(getattr(config, "ENABLE_CUDASIM", False))
        except Exception:
            return False
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "") not in ("", "0")


def _referenced(fn: Any, limit: int = 64) -> list[Any]:
    """What a function's closure and the globals it names hold (one level into tuples, lists, dicts)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    found: list[Any] = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            found.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    names = getattr(fn, "__globals__", {})
    found += [names[n] for n in code.co_names if n in names]
    flat: list[Any] = []
    for value in found:
        if isinstance(value, (tuple, list)):
            flat += list(value)[:16]
        elif isinstance(value, dict):
            flat += list(value.values())[:16]
        else:
            flat.append(value)
    return flat[:limit]


def _gpu_frameworks_in_use() -> list[str]:
    used = []
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "cuda", None) is not None and torch.cuda.is_initialized():
        used.append("torch")
    if "cupy" in sys.modules:
        used.append("cupy")
    from ..devsync import numba_context

    if numba_context() is not None:
        used.append("numba")
    return used


def detect(fn: Callable[..., Any], args: Sequence[Any]) -> str:
    """The framework of a call: from its arguments (and those a ``partial`` binds), then the callable,
    then the arrays its closure and the globals it names hold.

    GPU arrays decide: torch CUDA tensors, CuPy arrays, numba device arrays; mixing two is an
    error (pass ``framework=``). Without GPU arrays a numba kernel (or a launch configuration
    ``kernel[grid, block]``) means numba, host arrays mean the host clock. A callable that shows
    no array at all while a GPU framework is in use in this process is an error too: timing it
    on the host clock would measure launches, not kernels.
    """
    inner, bound = unwrap(fn)
    direct = [kind_of(a) for a in [*bound, *args]]
    found = {k for k in direct if k and k != "host"}
    saw_host = "host" in direct
    if not found and not saw_host:
        for obj in (inner, getattr(inner, "__self__", None)):
            mod = _module_of(obj)
            if mod.startswith("numba.cuda"):
                return "numba"
            if mod.startswith("cupy"):
                return "cupy"
        kinds = [kind_of(v) for v in _referenced(inner)]
        found = {k for k in kinds if k and k != "host"}
        saw_host = "host" in kinds
    if len(found) > 1:
        raise ValueError(f"the call uses {' and '.join(sorted(found))} arrays: pass framework= to say which to time")
    if found:
        return found.pop()
    if not saw_host:
        owner = getattr(inner, "__module__", "") or ""
        in_use = _gpu_frameworks_in_use()
        if owner.startswith("torch") and "torch" in in_use:
            return "torch"
        if in_use:
            raise ValueError(
                f"cannot tell which framework {getattr(inner, '__name__', inner)!r} runs on (no array "
                f"in its arguments; {', '.join(in_use)} in use here): pass framework='torch', "
                "'cupy', 'numba' or 'host'"
            )
    return "host"
