"""Worker side: the arrays of a problem, nested as the programs pass them (tuples, lists, dicts).

Framework-neutral: torch tensors and NumPy arrays (and scalars), with torch imported only when
the problem already did. Cloning, bitwise comparison (did the candidate write into its inputs?),
memory ranges (did it return an input as its output?), NaN poisoning of what is freed, and the
tolerance comparison of :mod:`krex_lab.bench.correctness`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

from ...bench.correctness import compare_output, poison, to_numpy

__all__ = [
    "arrays",
    "clone",
    "compare",
    "identical",
    "memory_ranges",
    "move",
    "overlapping",
    "poison_all",
    "refill",
    "seed_torch",
    "synchronize",
    "tolerances",
]


def _is_torch(x: Any) -> bool:
    return (type(x).__module__ or "").startswith("torch") and hasattr(x, "data_ptr")


def _is_numpy(x: Any) -> bool:
    return type(x).__module__ == "numpy" and hasattr(x, "__array_interface__")


def _is_array(x: Any) -> bool:
    return _is_torch(x) or _is_numpy(x)


def arrays(obj: Any) -> Iterator[Any]:
    """Every tensor or array in ``obj`` (depth first)."""
    if _is_array(obj):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from arrays(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from arrays(item)


def _map(obj: Any, fn: Callable[[Any], Any]) -> Any:
    if _is_array(obj):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(_map(o, fn) for o in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_map(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    return obj


def clone(obj: Any) -> Any:
    """A deep copy of the arrays (same device, same layout where the framework keeps it)."""
    return _map(obj, lambda x: x.clone() if _is_torch(x) else x.copy())


def move(obj: Any, device: str) -> Any:
    """torch tensors moved to ``device`` (KernelBench's inputs are made on the host)."""
    if device == "cpu":
        return obj
    return _map(obj, lambda x: x.to(device) if _is_torch(x) else x)


def identical(a: Any, b: Any) -> bool:
    """Bitwise the same arrays (NaN equal to NaN) and the same other values."""
    xs, ys = list(arrays(a)), list(arrays(b))
    if len(xs) != len(ys):
        return False
    import numpy as np

    for x, y in zip(xs, ys):
        if tuple(x.shape) != tuple(y.shape):
            return False
        if not np.array_equal(to_numpy(x), to_numpy(y), equal_nan=True):
            return False
    return True


def memory_ranges(obj: Any) -> list[tuple[int, int]]:
    """The memory each array's storage spans, as (start, end) addresses."""
    out: list[tuple[int, int]] = []
    for x in arrays(obj):
        if _is_torch(x):
            storage = x.untyped_storage()
            start = int(storage.data_ptr())
            out.append((start, start + max(1, int(storage.nbytes()))))
        else:
            base = x
            while getattr(base, "base", None) is not None:
                base = base.base
            start = int(base.__array_interface__["data"][0])
            out.append((start, start + max(1, int(base.nbytes))))
    return out


def overlapping(outputs: Any, inputs: Any) -> bool:
    """Some output shares memory with some input (the candidate returned an input, or a view of one)."""
    ins = memory_ranges(inputs)
    return any(s < ie and is_ < e for s, e in memory_ranges(outputs) for is_, ie in ins if s and is_)


def poison_all(obj: Any) -> None:
    """NaN (integers: a sentinel) into every array of ``obj``, before it is freed: memory a
    later allocation gets back never holds a result a candidate could pass off as its own."""
    for x in arrays(obj):
        try:
            if not getattr(x, "is_leaf", True) or getattr(x, "requires_grad", False):
                x = x.detach()
            poison(x)
        except Exception:
            pass


def refill(target: Any, source: Any) -> bool:
    """Copy ``source``'s values into ``target``'s arrays in place (the same buffers, new values)."""
    xs, ys = list(arrays(target)), list(arrays(source))
    if len(xs) != len(ys) or not xs:
        return False
    for x, y in zip(xs, ys):
        if tuple(x.shape) != tuple(y.shape):
            return False
        if _is_torch(x):
            x.copy_(y)
        else:
            x[...] = y
    return True


def seed_torch(seed: int) -> None:
    """``torch.manual_seed(seed)`` for the generators a problem draws from: the CPU's, and each
    CUDA device's. ``torch.manual_seed`` also queues a seed for every backend not initialised
    (XPU, MTIA; CUDA on a host without one), each with a formatted stack of its caller: about a
    millisecond per input set, a third of a CPU evaluation."""
    import torch

    torch.random.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        for generator in torch.cuda.default_generators:
            generator.manual_seed(seed)
    elif torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)  # applied when CUDA starts


def synchronize() -> None:
    """Wait for the GPU work of every framework this process uses (nothing on the CPU)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


#: (atol, rtol) by the output's precision: half precisions are looser
_TOLERANCES = {"float16": 1e-2, "bfloat16": 1e-2, "float32": 1e-4, "float64": 1e-7}


def tolerances(expected: Any, atol: float | None, rtol: float | None) -> tuple[float, float]:
    """The tolerances for ``expected``: as given, else by its loosest precision (default fp32's)."""
    loosest = 0.0
    for x in arrays(expected):
        name = str(x.dtype).replace("torch.", "")
        loosest = max(loosest, _TOLERANCES.get(name, 1e-4 if "float" in name or "complex" in name else 0.0))
    default = loosest or 1e-4
    return (default if atol is None else atol, default if rtol is None else rtol)


def compare(actual: Any, expected: Any, atol: float, rtol: float) -> tuple[bool, str, list[float], list[float]]:
    """(ok, what differs, max abs differences, mean abs differences) of two nested outputs."""
    import numpy as np

    xs, ys = list(arrays(actual)), list(arrays(expected))
    if not ys and not xs:
        ok = actual == expected
        return bool(ok), "" if ok else f"got {actual!r}, expected {expected!r}", [], []
    if len(xs) != len(ys):
        return False, f"the candidate gave {len(xs)} output array(s), the reference {len(ys)}", [], []
    problems: list[str] = []
    maxes: list[float] = []
    means: list[float] = []
    for k, (x, y) in enumerate(zip(xs, ys)):
        a, e = to_numpy(x), to_numpy(y)
        diff = compare_output(f"output {k}", a, e, rtol, atol)
        if a.shape == e.shape and a.size:
            with np.errstate(invalid="ignore", over="ignore"):
                err = np.abs(a.astype(np.float64) - e.astype(np.float64))
            maxes.append(float(np.nanmax(err)) if np.isfinite(err).any() else float("nan"))
            means.append(float(np.nanmean(err)) if np.isfinite(err).any() else float("nan"))
        if not diff.ok:
            problems.append(diff.describe())
    return not problems, "\n".join(problems), maxes, means
