"""What every kernel of the library declares (:class:`KernelSpec`) and the device helpers they share.

A candidate is a plain Python function ``candidate(*inputs, *outputs)`` that launches numba.cuda
kernels on the default stream and writes its outputs. It accepts NumPy arrays (copied to the
device and back, convenient for :func:`krex_lab.check`) or device arrays (numba, or anything with
``__cuda_array_interface__`` such as CuPy arrays and torch tensors: nothing is copied, which is
what timing wants).

In numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) every thread is a Python thread, so block
sizes shrink (:data:`SIMULATOR`) to keep the tests fast; the kernels' code is the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda as numba_cuda

# Some numba-cuda releases register an overload for np.row_stack, which NumPy 2.4 removed,
# when their first kernel compiles (seen on the H200 image: every compile failed with
# "module 'numpy' has no attribute 'row_stack'"). The alias lets them compile there.
if not hasattr(np, "row_stack"):
    setattr(np, "row_stack", np.vstack)  # noqa: B010 - numpy stubs may lack it

cuda: Any = numba_cuda  # numba's own annotations do not describe kernel code

#: numba.cuda is its simulator (decided when it was imported)
SIMULATOR: bool = hasattr(numba_cuda, "FakeCUDAKernel")
#: threads of a 1-D block
THREADS = 32 if SIMULATOR else 256

#: the roofline assumptions behind the presets (H200 SXM): HBM3e peak 4.8 TB/s of which a good
#: streaming kernel reaches about 85 %, and what a register-tiled numba fp32 matmul reaches of
#: the 67 TFLOP/s fp32 peak (an estimate; the device run measures it)
H200_BANDWIDTH = 4.8e12
ACHIEVED_BANDWIDTH = 0.85 * H200_BANDWIDTH
TILED_MATMUL_FLOPS = 12e12
LAUNCH_MS = 0.004

Size = Mapping[str, int]
Shapes = tuple[list[tuple[int, ...]], list[tuple[int, ...]]]
Case = tuple[tuple[Any, ...], tuple[Any, ...]]


def device(x: Any) -> Any:
    """A device view of ``x``: NumPy arrays are copied to the device, device arrays used as they are."""
    if isinstance(x, np.ndarray):
        return cuda.to_device(x)
    if hasattr(x, "__cuda_array_interface__") and not type(x).__module__.startswith("numba"):
        return cuda.as_cuda_array(x)  # CuPy, torch: no copy
    return x


def write_back(dev: Any, host: Any) -> None:
    """Copy a device result into ``host`` when the caller passed a NumPy array."""
    if isinstance(host, np.ndarray) and dev is not host:
        dev.copy_to_host(host)


def sm_count() -> int:
    if SIMULATOR:
        return 1
    return int(getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 0) or 132)


def blocks(n: int, threads: int = THREADS, limit: int | None = None) -> int:
    """Blocks to cover ``n`` items with ``threads`` each, at most ``limit`` (a grid-stride kernel's cap)."""
    count = max(1, -(-n // threads))
    return min(count, limit) if limit else count


@dataclass(frozen=True)
class Work:
    bytes: float
    flops: float = 0.0


@dataclass(frozen=True)
class KernelSpec:
    """A kernel of the library: candidates, NumPy reference, shapes, presets, tolerances."""

    name: str
    summary: str
    #: ``reference(*inputs)`` on NumPy arrays returns the expected output(s)
    reference: Callable[..., Any]
    #: ``shapes(**size)`` -> (input shapes, output shapes); every array is float32
    shapes: Callable[..., Shapes]
    #: "naive" and "optimised", each ``candidate(*inputs, *outputs)``
    candidates: Mapping[str, Callable[..., Any]]
    #: "0.05ms", "0.1ms", "1ms", "10ms": sizes estimated to take about that long on an H200
    presets: Mapping[str, Size]
    #: tiny sizes (odd, not multiples of the block) for the simulator tests
    test_sizes: Sequence[Size]
    #: ``work(**size)``: bytes moved and flops of the optimised candidate
    work: Callable[..., Work]
    rtol: float = 1e-5
    atol: float = 1e-6
    low: float = -1.0
    high: float = 1.0
    flops_rate: float = 0.0

    def size(self, size: str | Size | None = None) -> dict[str, int]:
        if size is None:
            return dict(self.test_sizes[0])
        if isinstance(size, str):
            if size not in self.presets:
                raise KeyError(f"{self.name} has presets {', '.join(self.presets)}, not {size!r}")
            return dict(self.presets[size])
        return dict(size)

    def make_inputs(self, rng: np.random.Generator, size: str | Size | None = None) -> Case:
        """Fresh random host inputs and (uninitialised) host outputs."""
        ins, outs = self.shapes(**self.size(size))
        inputs = tuple(rng.uniform(self.low, self.high, s).astype(np.float32) for s in ins)
        return inputs, tuple(np.empty(s, dtype=np.float32) for s in outs)

    def inputs_maker(self, size: str | Size | None = None) -> Callable[[np.random.Generator], Case]:
        """``make_inputs`` for :func:`krex_lab.check` at ``size``."""
        chosen = self.size(size)
        return lambda rng: self.make_inputs(rng, chosen)

    def device_inputs(self, size: str | Size | None = None, seed: int = 0) -> Case:
        """Inputs filled on the device (no host copy; fast at large sizes) and device outputs."""
        ins, outs = self.shapes(**self.size(size))
        inputs = []
        for k, s in enumerate(ins):
            arr = cuda.device_array(s, dtype=np.float32)
            fill(arr, seed * 7919 + k, self.low, self.high)
            inputs.append(arr)
        cuda.synchronize()
        return tuple(inputs), tuple(cuda.device_array(s, dtype=np.float32) for s in outs)

    def candidate(self, name: str) -> Callable[..., Any]:
        if name not in self.candidates:
            raise KeyError(f"{self.name} has candidates {', '.join(self.candidates)}, not {name!r}")
        return self.candidates[name]

    def check(
        self,
        candidate: str | Callable[..., Any] = "optimised",
        size: str | Size | None = None,
        trials: int = 1,
        seed: int | None = None,
    ) -> Any:
        """:func:`krex_lab.check` of a candidate (by name or a function) against the reference."""
        from krex_lab.bench import check

        fn = self.candidate(candidate) if isinstance(candidate, str) else candidate
        return check(
            fn, self.reference, self.inputs_maker(size), rtol=self.rtol, atol=self.atol, trials=trials, seed=seed
        )

    def estimate_ms(self, size: str | Size) -> float:
        """Roofline estimate on an H200 (see :data:`ACHIEVED_BANDWIDTH`, :data:`TILED_MATMUL_FLOPS`)."""
        w = self.work(**self.size(size))
        t = w.bytes / ACHIEVED_BANDWIDTH
        if w.flops and self.flops_rate:
            t = max(t, w.flops / self.flops_rate)
        return t * 1e3 + LAUNCH_MS


@cuda.jit
def _fill(flat, seed, low, span):  # type: ignore[no-untyped-def]
    # Golden-ratio sequence: evenly spread values in [low, low + span), no integer overflow.
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < flat.size:
        u = (i * 0.6180339887498949 + seed * 0.7548776662466927) % 1.0
        flat[i] = low + span * u
        i += stride


def fill(arr: Any, seed: int, low: float = -1.0, high: float = 1.0) -> None:
    """Fill a contiguous device array in place with deterministic, well spread values."""
    flat = arr.reshape(arr.size)
    _fill[blocks(arr.size, THREADS, sm_count() * 16), THREADS](flat, seed, low, high - low)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def square_root_size(elements: float, multiple: int) -> int:
    """The multiple of ``multiple`` nearest to sqrt(elements) (for presets)."""
    return max(multiple, round(math.sqrt(elements) / multiple) * multiple)
