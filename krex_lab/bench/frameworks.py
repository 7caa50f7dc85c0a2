"""Framework adapters: the few device operations the timing loop needs, for torch, CuPy and numba.cuda.

Each adapter times on one stream and runs the callable on it:

* torch: the current stream of the arguments' device (or ``stream=``), entered around every batch;
* CuPy: the current stream (or ``stream=``), entered around every batch;
* numba.cuda: numba has no "current stream"; kernels launched without one run on the default
  stream, so that is the timing stream unless ``stream=`` names the stream the callable uses.

The operations are: timing events on that stream, a spin kernel that holds the stream for a
given number of units (clock cycles for torch and CuPy, loop iterations for numba; the sampler
calibrates units per millisecond), an L2 flush (a write of twice the L2 size), and, for torch,
a CUDA graph of K calls. :class:`HostAdapter` times a call on the host clock (NumPy, or any
callable in numba's CUDA simulator, where timings are meaningless and flagged as simulated).

Nothing here is imported by ``import krex_lab``; a framework is imported only when detected.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from .detect import detect, kind_of, numba_simulator, unwrap

FRAMEWORKS = ("torch", "cupy", "numba", "host")
FLUSH_MIN_BYTES = 8 << 20
L2_FALLBACK_BYTES = 64 << 20


@dataclass
class DeviceInfo:
    name: str = "host"
    uuid: str | None = None
    ordinal: int | None = None  # the framework's device number (after CUDA_VISIBLE_DEVICES)
    l2_bytes: int | None = None
    nvml_index: int | None = None

    def to_dict(self) -> DeviceDict:
        return DeviceDict(
            name=self.name, uuid=self.uuid, ordinal=self.ordinal, l2_bytes=self.l2_bytes, nvml_index=self.nvml_index
        )


class DeviceDict(TypedDict):
    """A :class:`DeviceInfo` as plain data: a measurement's ``device`` (``Measurement.to_dict``, result files)."""

    name: str
    uuid: str | None
    ordinal: int | None
    l2_bytes: int | None
    nvml_index: int | None


class HostAdapter:
    """A call timed by the host clock (``time.perf_counter``); nothing on a GPU is held or flushed."""

    name = "host"
    device_timing = False

    def __init__(self, fn: Callable[..., Any], args: Sequence[Any], simulated: bool = False) -> None:
        self.fn, self.args = fn, tuple(args)
        self.simulated = simulated
        self.info = DeviceInfo(name="numba CUDA simulator (host)" if simulated else "host")

    def call(self) -> None:
        self.fn(*self.args)

    def prime(self) -> None:
        """One untimed call, waited for: JIT compilation and first-use allocations happen here."""
        self.call()
        self.synchronize()

    def synchronize(self) -> None:
        pass

    def close(self) -> None:
        pass


class DeviceAdapter(HostAdapter):
    """Base of the GPU adapters: one timing stream, events, spin, flush."""

    device_timing = True
    #: spin units for one calibration run (about 10 ms on an H200)
    calibration_units = 20_000_000

    def __init__(self, fn: Callable[..., Any], args: Sequence[Any]) -> None:
        super().__init__(fn, args)
        self.flush_bytes = 0

    def flush_size(self, l2_bytes: int | None) -> int:
        return max(2 * (l2_bytes or L2_FALLBACK_BYTES), FLUSH_MIN_BYTES)

    def stream_context(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def prime(self) -> None:
        with self.stream_context():
            self.call()
        self.synchronize()

    def event(self) -> Any:
        raise NotImplementedError

    def record(self, event: Any) -> None:
        raise NotImplementedError

    def done(self, event: Any) -> bool:
        raise NotImplementedError

    def wait(self, event: Any) -> None:
        raise NotImplementedError

    def elapsed_ms(self, start: Any, end: Any) -> float:
        raise NotImplementedError

    def spin(self, units: int) -> None:
        raise NotImplementedError

    def prepare_flush(self) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError

    def graph(self, calls: int) -> Callable[[], None]:
        raise NotImplementedError(
            f"CUDA graph timing is implemented for torch only, not {self.name}; use method='held'"
        )


class TorchAdapter(DeviceAdapter):
    name = "torch"

    def __init__(self, fn: Callable[..., Any], args: Sequence[Any], stream: Any = None) -> None:
        super().__init__(fn, args)
        import torch

        self.torch = torch
        _, bound = unwrap(fn)
        cuda_args = [a for a in [*bound, *args] if kind_of(a) == "torch"]
        self.device = cuda_args[0].device if cuda_args else torch.device("cuda", torch.cuda.current_device())
        self.stream = stream if stream is not None else torch.cuda.current_stream(self.device)
        props = torch.cuda.get_device_properties(self.device)
        uuid = getattr(props, "uuid", None)
        self.info = DeviceInfo(
            name=str(props.name),
            uuid=str(uuid) if uuid is not None else None,
            ordinal=self.device.index,
            l2_bytes=getattr(props, "L2_cache_size", None),
        )
        if not hasattr(torch.cuda, "_sleep"):
            raise RuntimeError("this torch has no torch.cuda._sleep (the spin kernel that holds the stream)")
        self._buf: Any = None

    def stream_context(self) -> contextlib.AbstractContextManager[Any]:
        return self.torch.cuda.stream(self.stream)

    def event(self) -> Any:
        return self.torch.cuda.Event(enable_timing=True)

    def record(self, event: Any) -> None:
        event.record(self.stream)

    def done(self, event: Any) -> bool:
        return bool(event.query())

    def wait(self, event: Any) -> None:
        event.synchronize()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end))

    def spin(self, units: int) -> None:
        self.torch.cuda._sleep(int(units))  # on the current stream: callers are inside stream_context()

    def prepare_flush(self) -> None:
        self.flush_bytes = self.flush_size(self.info.l2_bytes)
        self._buf = self.torch.empty(self.flush_bytes // 4, dtype=self.torch.int32, device=self.device)

    def flush(self) -> None:
        self._buf.zero_()

    def synchronize(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def graph(self, calls: int) -> Callable[[], None]:
        torch = self.torch
        side = torch.cuda.Stream(self.device)  # warm-up before capture on a side stream, as torch asks
        side.wait_stream(self.stream)
        with torch.cuda.stream(side):
            for _ in range(3):
                self.call()
        self.stream.wait_stream(side)
        self.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                self.call()
        self.synchronize()
        replay: Callable[[], None] = graph.replay
        return replay

    def close(self) -> None:
        self._buf = None


_CUPY_SPIN = r"""
extern "C" __global__ void krex_spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


class CupyAdapter(DeviceAdapter):
    name = "cupy"

    def __init__(self, fn: Callable[..., Any], args: Sequence[Any], stream: Any = None) -> None:
        super().__init__(fn, args)
        import cupy

        self.cupy = cupy
        self.stream = stream if stream is not None else cupy.cuda.get_current_stream()
        dev = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        name = props.get("name", b"")
        raw = props.get("uuid")
        uuid = None
        if isinstance(raw, (bytes, bytearray)) and len(raw) == 16:
            h = raw.hex()
            uuid = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        self.info = DeviceInfo(
            name=name.decode() if isinstance(name, bytes) else str(name),
            uuid=uuid,
            ordinal=dev.id,
            l2_bytes=props.get("l2CacheSize"),
        )
        self._spin = cupy.RawKernel(_CUPY_SPIN, "krex_spin")
        self._buf: Any = None

    def stream_context(self) -> contextlib.AbstractContextManager[Any]:
        context: contextlib.AbstractContextManager[Any] = self.stream  # a CuPy stream is its own context
        return context

    def event(self) -> Any:
        return self.cupy.cuda.Event()

    def record(self, event: Any) -> None:
        event.record(self.stream)

    def done(self, event: Any) -> bool:
        return bool(event.done)

    def wait(self, event: Any) -> None:
        event.synchronize()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(self.cupy.cuda.get_elapsed_time(start, end))

    def spin(self, units: int) -> None:
        import numpy

        self._spin((1,), (1,), (numpy.int64(units),), stream=self.stream)

    def prepare_flush(self) -> None:
        self.flush_bytes = self.flush_size(self.info.l2_bytes)
        self._buf = self.cupy.empty(self.flush_bytes, dtype=self.cupy.uint8)

    def flush(self) -> None:
        self.cupy.cuda.runtime.memsetAsync(self._buf.data.ptr, 0, self.flush_bytes, self.stream.ptr)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def close(self) -> None:
        self._buf = None


@functools.lru_cache(maxsize=1)
def _numba_kernels() -> tuple[Any, Any]:
    from numba import cuda as numba_cuda
    from numba import float32

    cuda: Any = numba_cuda  # numba's own annotations do not describe kernel code

    @cuda.jit
    def spin(iterations, sink):  # type: ignore[no-untyped-def]
        # A dependent multiply-add chain: its length is the hold; calibrated in ms by events.
        x = float32(1.0)
        for _ in range(iterations):
            x = x * float32(0.999999) + float32(1e-7)
        if x == float32(-1.0):
            sink[0] = x

    @cuda.jit
    def zero(buf):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < buf.size:
            buf[i] = 0
            i += stride

    return spin, zero


class NumbaAdapter(DeviceAdapter):
    name = "numba"
    calibration_units = 2_000_000

    def __init__(self, fn: Callable[..., Any], args: Sequence[Any], stream: Any = None) -> None:
        super().__init__(fn, args)
        from numba import cuda as numba_cuda

        cuda: Any = numba_cuda
        self.cuda = cuda
        self.stream = stream if stream is not None else cuda.default_stream()
        dev = cuda.get_current_device()
        name = dev.name
        self.info = DeviceInfo(
            name=name.decode() if isinstance(name, bytes) else str(name),
            uuid=getattr(dev, "uuid", None),
            ordinal=int(dev.id),
            l2_bytes=getattr(dev, "L2_CACHE_SIZE", None),
        )
        self._sms = int(getattr(dev, "MULTIPROCESSOR_COUNT", 0) or 64)
        self._spin, self._zero = _numba_kernels()
        self._sink = cuda.device_array(1, dtype="float32")
        self._buf: Any = None

    def event(self) -> Any:
        return self.cuda.event(timing=True)

    def record(self, event: Any) -> None:
        event.record(stream=self.stream)

    def done(self, event: Any) -> bool:
        return bool(event.query())

    def wait(self, event: Any) -> None:
        event.synchronize()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(self.cuda.event_elapsed_time(start, end))

    def spin(self, units: int) -> None:
        self._spin[1, 1, self.stream](int(units), self._sink)

    def prepare_flush(self) -> None:
        self.flush_bytes = self.flush_size(self.info.l2_bytes)
        self._buf = self.cuda.device_array(self.flush_bytes // 4, dtype="int32")
        self.flush()  # compiled now, not inside the first held batch
        self.synchronize()

    def flush(self) -> None:
        self._zero[self._sms * 4, 256, self.stream](self._buf)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def close(self) -> None:
        self._buf = None


#: the module each GPU framework imports first, and how to install it
INSTALL = {
    "torch": ("torch", "pip install torch (a CUDA build: see https://pytorch.org/get-started/locally/)"),
    "cupy": ("cupy", "pip install cupy-cuda12x (or cupy-cuda11x, matching the CUDA driver)"),
    "numba": ("numba.cuda", "pip install 'krex-lab[numba]'"),
}


def _require(kind: str) -> None:
    """Import ``kind``'s module now, so that a missing one is one clear error (the adapters import it
    inside their constructors, where a bare ModuleNotFoundError would say nothing about bench)."""
    from ..errors import MissingDependency

    module, install = INSTALL[kind]
    try:
        importlib.import_module(module)
    except ImportError as exc:
        package = module.split(".")[0]
        raise MissingDependency.of(package, f"krex_lab.bench(framework={kind!r})", install, exc) from exc


def make_adapter(
    fn: Callable[..., Any], args: Sequence[Any], framework: str | None = None, stream: Any = None
) -> HostAdapter:
    """The adapter for ``fn(*args)``: ``framework`` if given, else :func:`detect`'s answer."""
    kind = framework or detect(fn, args)
    if kind not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, not {kind!r}")
    if kind != "host":
        _require(kind)
    if kind == "numba" and numba_simulator():
        return HostAdapter(fn, args, simulated=True)
    if kind == "torch":
        return TorchAdapter(fn, args, stream)
    if kind == "cupy":
        return CupyAdapter(fn, args, stream)
    if kind == "numba":
        return NumbaAdapter(fn, args, stream)
    return HostAdapter(fn, args)
