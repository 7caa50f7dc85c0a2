"""The candidate's return value, put into the judge's output buffers before the call is over.

The judge hands every call its output buffers (memory it owns: a memfd on a CPU, a CUDA IPC
allocation on a GPU), laid out as the reference's output is. :func:`deliver` walks what the
candidate returned by exact type only (a ``tuple``, ``list`` or ``dict`` itself, never a subclass,
whose methods could run code), requires every array to be exactly ``torch.Tensor`` or
``numpy.ndarray`` of the buffer's shape, and copies its values in. So whatever work a lazy value, a
subclass, a finalizer or a page-fault handler hides runs here, inside the call as the judge's clock
sees it; after the call the judge reads only its own buffers. An object of any other type is
refused by name (:class:`OutputRejected`).

This runs in the candidate's process, which may patch it: it decides nothing. What it cannot
change is that the judge reads its own buffers (poisoned before each call) and nothing else.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["OutputMismatch", "OutputRejected", "deliver", "overlaps"]

_PLAIN = (bool, int, float, str, type(None))


class OutputRejected(Exception):
    """The candidate returned an object of a type that is not accepted (named in the message)."""


class OutputMismatch(Exception):
    """The candidate returned arrays of another count, shape, kind of dtype or device."""


def _type_name(x: Any) -> str:
    t = type(x)
    bases = [b for b in t.__mro__[1:] if b.__module__ in ("torch", "numpy", "builtins") and b is not object]
    name = f"{t.__module__}.{t.__qualname__}"
    if bases:
        b = bases[0]
        return f"{name} (a subclass of {b.__module__}.{b.__qualname__})"
    return name


def _leaves(value: Any, out: list[Any], depth: int = 0) -> None:
    if depth > 32:
        raise OutputRejected("the output is nested more than 32 levels deep")
    t = type(value)
    if t is tuple or t is list:
        for v in value:
            _leaves(v, out, depth + 1)
    elif t is dict:
        for v in dict.values(value):
            _leaves(v, out, depth + 1)
    else:
        out.append(value)


def _kind(dtype: Any) -> str:
    name = str(dtype).replace("torch.", "")
    if name == "bool":
        return "bool"
    if "complex" in name:
        return "complex"
    if "float" in name:
        return "float"
    return "int"


def overlaps(x: Any, spans: list[tuple[int, int, int]]) -> list[int]:
    """The inputs (``(start, end, index)`` of their memory) whose memory ``x`` itself lies in (the
    elements it views, not its whole storage: a set's inputs share one mapping)."""
    torch = sys.modules.get("torch")
    if torch is not None and type(x) is torch.Tensor:
        lo, item = int(x.data_ptr()), int(x.element_size())
        strides = [int(s) * item for s in x.stride()]
    else:
        lo, item = int(x.__array_interface__["data"][0]), int(x.itemsize)
        strides = [int(s) for s in x.strides]
    if not lo or any(int(n) == 0 for n in x.shape):
        return []
    reach = [(int(n) - 1) * s for n, s in zip(x.shape, strides)]
    first = lo + sum(r for r in reach if r < 0)
    last = lo + sum(r for r in reach if r > 0) + item
    return [k for s, e, k in spans if s and first < e and s < last]


def deliver(value: Any, buffers: list[Any], spans: list[tuple[int, int, int]]) -> tuple[list[Any], list[int]]:
    """``value``'s leaves into ``buffers`` (None where the reference's leaf is a plain scalar):
    (the scalars, in order; the inputs whose memory an output shares)."""
    leaves: list[Any] = []
    _leaves(value, leaves)
    if len(leaves) != len(buffers):
        raise OutputMismatch(f"the candidate returned {len(leaves)} output value(s), the reference {len(buffers)}")
    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    scalars: list[Any] = []
    aliased: list[int] = []
    for k, (x, buf) in enumerate(zip(leaves, buffers)):
        if buf is None:
            if type(x) in _PLAIN:
                scalars.append(x)
            elif np is not None and isinstance(x, np.generic) and type(x).__module__ == "numpy":
                scalars.append(x.item())
            else:
                raise OutputRejected(f"output {k} is a {_type_name(x)}; the reference's is a plain scalar")
            continue
        is_torch = torch is not None and type(buf) is torch.Tensor
        want = torch.Tensor if is_torch else np.ndarray  # type: ignore[union-attr]
        if type(x) is not want:
            raise OutputRejected(
                f"output {k} is a {_type_name(x)}; it must be exactly {want.__module__}.{want.__qualname__}"
            )
        if tuple(x.shape) != tuple(buf.shape):
            raise OutputMismatch(f"output {k} has shape {tuple(x.shape)}, the reference's {tuple(buf.shape)}")
        if _kind(x.dtype) != _kind(buf.dtype):
            raise OutputMismatch(f"output {k} is {x.dtype}, the reference's {buf.dtype}")
        if is_torch:
            if x.device.type != buf.device.type:
                raise OutputMismatch(f"output {k} is on {x.device.type}, the reference's on {buf.device.type}")
            with torch.no_grad():  # type: ignore[union-attr]
                buf.copy_(x)
        else:
            np.copyto(buf, x, casting="same_kind")  # type: ignore[union-attr]
        aliased += overlaps(x, spans)
    return scalars, sorted(set(aliased))
