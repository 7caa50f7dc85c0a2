"""``krex_lab.bench(fn, *args, **options)``: time a GPU callable properly, inside a region."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..region_report import RegionReport
from .frameworks import HostAdapter, make_adapter
from .measurement import NO_GPU, Measurement
from .stats import CONVERGED, STABLE, Criterion, noise_met
from .throttle import DEFAULT_THRESHOLD, ClockLog, nvml_index, open_clocks
from .timing import HeldSampler, HostSampler, Sampler, batch_size, collect, warm_up

#: defaults when the call runs in numba's CUDA simulator (a smoke test: its times mean nothing)
SIMULATOR_DEFAULTS: dict[str, float] = {
    "min_samples": 3,
    "min_time": 0.0,
    "timeout": 2.0,
    "max_samples": 10,
    "warmup": 0.0,
}
#: option name -> its default (numbers all)
DEFAULTS: dict[str, float] = {
    "min_samples": 10,
    "min_time": 0.5,
    "max_noise": 0.005,
    "timeout": 15.0,
    "max_samples": 100_000,
    "warmup": 0.2,
}
METHODS = ("held", "graph")


class _Held:
    """The region a measurement runs in (or None); ``report`` is final after the block."""

    def __init__(self) -> None:
        self.report: RegionReport | None = None


@contextmanager
def _region(
    enabled: bool, gpu: int | None, max_hold: float | None, freeze: bool, device_index: int | None, notes: list[str]
) -> Iterator[_Held]:
    held = _Held()
    if not enabled:
        yield held
        return
    from .. import client
    from ..errors import ArbiterUnavailable, InvalidRequest, LeaseExpired

    session = client.current_session()
    if session is None and gpu is None and not os.environ.get("KREX_GPU", "").strip():
        gpu = device_index  # register on the GPU being timed, not wherever the arbiter would place us
    if session is not None and gpu is None and device_index is not None and device_index != session.gpu:
        notes.append(
            f"this session is on GPU {session.gpu} but the timed device is NVML GPU {device_index}: "
            f"the region protects GPU {session.gpu}"
        )
    region = client.Exclusive(gpu=gpu, max_hold=max_hold, freeze=freeze, session=session)
    try:
        region.acquire()
    except ArbiterUnavailable as exc:
        raise ArbiterUnavailable(
            f"{exc} (krex_lab.bench measures inside a region by default; exclusive=False measures without one)"
        ) from None
    except InvalidRequest as exc:
        if "already holds" not in str(exc):
            raise
        # Called inside the caller's own region (%%krex_exclusive, `with exclusive()`): use it.
        held.report = RegionReport(region=str(exc).split(" already holds or waits for ")[-1].split()[0], nested=True)
        yield held
        return
    try:
        yield held
    finally:
        report = region.release()
        held.report = report
    if report.expired:
        raise LeaseExpired(
            f"region {region.id} exceeded max_hold={report.max_hold_s} s before the "
            "measurement ended: pass a larger max_hold= or a shorter timeout="
        )


def bench(
    fn: Callable[..., Any],
    *args: Any,
    framework: str | None = None,
    name: str | None = None,
    exclusive: bool = True,
    gpu: int | None = None,
    max_hold: float | None = None,
    freeze: bool = True,
    l2_flush: bool = True,
    warmup: float | None = None,
    exclusive_warmup: bool = False,
    min_samples: int | None = None,
    min_time: float | None = None,
    max_noise: float | None = None,
    timeout: float | None = None,
    max_samples: int | None = None,
    method: str = "held",
    graph_calls: int | None = None,
    stream: Any = None,
    throttle_check: bool = True,
    throttle_threshold: float = DEFAULT_THRESHOLD,
    batch_ms: float = 10.0,
) -> Measurement:
    """Time ``fn(*args)`` on the GPU and return a :class:`Measurement` (milliseconds).

    Method (``method="held"``): per sample an L2 flush (``l2_flush``), then CUDA events around one
    call, the whole batch enqueued while a spin kernel holds the stream, so host launch latency is
    never inside an interval. ``method="graph"`` (torch): a CUDA graph of ``graph_calls`` calls per
    sample, per-call time = replay / calls. After ``warmup`` seconds, samples until nvbench's
    criterion holds: ``min_samples`` (10) and ``min_time`` (0.5 s of measured time), then noise
    (relative stdev) under ``max_noise`` (0.5 %) or settled; at most ``timeout`` (15 s) of wall time.
    Samples taken while NVML reports the SM clock throttled (below ``throttle_threshold`` of its
    maximum, or a thermal/power slowdown) are discarded and counted.

    The framework (torch, CuPy, numba.cuda; ``host`` = the host clock) comes from the arguments or
    the callable, or ``framework=``; the call runs on that framework's current stream (numba: the
    default stream), or on ``stream=``. Wrap keyword arguments with ``functools.partial``. The
    sampling runs in a KREX region (``krex_lab.exclusive``) unless ``exclusive=False``: the
    warm-up runs before it, sharing the GPU, and one batch in the region, not kept, settles the
    GPU again (``exclusive_warmup=True`` holds the region over the warm-up too). Inside a region
    this session already holds (``%%krex_exclusive``) it uses that one. ``freeze=False``: the
    region stops no other session (drain and core isolation stay). ``phases`` of the result
    says where the wall time went.
    In numba's CUDA simulator the call is timed on the host with small budgets, flagged simulated.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
    t_start = time.monotonic()
    adapter = make_adapter(fn, args, framework, stream)
    simulated = adapter.simulated
    given = {
        "min_samples": min_samples,
        "min_time": min_time,
        "max_noise": max_noise,
        "timeout": timeout,
        "max_samples": max_samples,
        "warmup": warmup,
    }
    defaults = {**DEFAULTS, **(SIMULATOR_DEFAULTS if simulated else {})}
    opts = {k: (v if v is not None else defaults[k]) for k, v in given.items()}
    criterion = Criterion(
        min_samples=int(opts["min_samples"]),
        min_time=float(opts["min_time"]),
        max_noise=float(opts["max_noise"]),
        timeout=float(opts["timeout"]),
        max_samples=int(opts["max_samples"]),
    )
    notes: list[str] = []
    device_timing = adapter.device_timing
    if device_timing:
        adapter.info.nvml_index = nvml_index(adapter.info.uuid, _visible_index(adapter.info.ordinal))
    clocks = ClockLog(
        open_clocks(adapter.info.nvml_index) if device_timing and throttle_check else None, throttle_threshold
    )
    if device_timing and throttle_check and clocks.source is None:
        notes.append("NVML is not usable here: no throttle check, no clock readings")
    if max_hold is None and opts["warmup"] + criterion.timeout + 20 > 60:
        max_hold = opts["warmup"] + criterion.timeout + 30  # beyond the arbiter's default 60 s lease
    label = name or getattr(fn, "__name__", None) or type(fn).__name__
    phases: dict[str, float] = {}
    try:
        lap = time.monotonic()
        with contextlib.ExitStack() as stack:
            if exclusive_warmup:
                held = stack.enter_context(_region(exclusive, gpu, max_hold, freeze, adapter.info.nvml_index, notes))
                lap = _phase(phases, "region_wait_s", lap)
            sampler, method_text, batch_limit = _sampler(adapter, method, l2_flush and device_timing, graph_calls)
            lap = _phase(phases, "setup_s", lap)
            warm = warm_up(sampler, float(opts["warmup"]))
            lap = _phase(phases, "warmup_s", lap)
            if not exclusive_warmup:
                # Only the sampling is exclusive: setup and warm-up (compile, allocation, clocks,
                # the estimate) share the GPU, then one batch in the region settles it again.
                held = stack.enter_context(_region(exclusive, gpu, max_hold, freeze, adapter.info.nvml_index, notes))
                lap = _phase(phases, "region_wait_s", lap)
                if isinstance(sampler, HeldSampler):
                    sampler.units_per_ms = sampler.calibrate()  # the spin's rate, the GPU alone
                settle = sampler.batch(batch_size(warm.estimate_ms, batch_ms, batch_limit))
                warm.estimate_ms = sorted(settle)[len(settle) // 2]
                lap = _phase(phases, "settle_s", lap)
            batch = batch_size(warm.estimate_ms, batch_ms, batch_limit)
            got = collect(sampler, criterion, batch, clocks)
            lap = _phase(phases, "sampling_s", lap)
            if isinstance(sampler, HeldSampler):
                phases["spin_s"] = sampler.spin_ms / 1e3
    finally:
        clocks.close()
        adapter.close()
    state = got.state
    if not device_timing:
        # Said first: every figure below is a host time, whatever the region or the backend.
        what = "numba's CUDA simulator on the host" if simulated else "the call on the host clock"
        notes.append(
            f"{NO_GPU}: these are times of {what} (no torch/CuPy/numba GPU arrays in the call; "
            "GPU work it launches asynchronously is not in them)"
        )
    if not state.samples:
        notes.append("no sample was kept: every batch was taken while the GPU was throttled")
    elif got.stop_reason == STABLE and not noise_met(state.noise, state.n, criterion.max_noise):
        notes.append(
            f"not converged: the noise settled at {state.noise:.2%}, above max_noise={criterion.max_noise:.2%} "
            "(more samples would not lower it: a quieter machine, a region, or a larger max_noise)"
        )
    elif got.stop_reason not in CONVERGED:
        notes.append(f"stopped by {got.stop_reason} before converging: " + "; ".join(state.shortfalls()))
    if state.discarded:
        notes.append(
            f"{state.discarded} samples discarded while the GPU was throttled: "
            + ", ".join(f"{k} ({v})" for k, v in state.discard_reasons.items())
        )
    if held.report is not None and held.report.simulated:
        notes.append("the arbiter runs a simulated (fake) backend: the region did not stop real GPU work")
    measured_by = criterion.to_dict()
    measured_by["warmup"] = opts["warmup"]
    return Measurement.from_samples(
        label,
        adapter.name if not simulated else "numba (simulator)",
        method_text,
        list(state.samples),
        discarded=state.discarded,
        discard_reasons=dict(state.discard_reasons),
        redone_batches=sampler.redone,
        stop_reason=got.stop_reason,
        simulated=simulated,
        gpu_timed=device_timing,
        l2_flush=bool(l2_flush and device_timing),
        batch=batch,
        wall_s=time.monotonic() - t_start,
        warmup={"calls": warm.calls, "seconds": warm.seconds, "estimate_ms": warm.estimate_ms},
        phases={k: round(v, 6) for k, v in phases.items()},
        clocks=clocks.summary(),
        device=adapter.info.to_dict(),
        region=held.report,
        criterion=measured_by,
        warnings=notes,
    )


def _phase(phases: dict[str, float], name: str, since: float) -> float:
    now = time.monotonic()
    phases[name] = now - since
    return now


def _sampler(adapter: HostAdapter, method: str, l2_flush: bool, graph_calls: int | None) -> tuple[Sampler, str, int]:
    adapter.prime()
    if not adapter.device_timing:
        if method == "graph":
            raise ValueError("method='graph' needs a GPU framework (torch)")
        what = "host clock (numba CUDA simulator)" if adapter.simulated else "host clock (time.perf_counter)"
        return HostSampler(adapter.call, adapter.synchronize), what, 1
    if method == "graph":
        k = graph_calls or 0
        if k <= 0:  # enough calls that one replay is about 1 ms
            probe = HeldSampler(adapter, l2_flush=False)
            probe.batch(2)
            est = sorted(probe.batch(5))[2]
            k = max(1, min(1000, round(1.0 / max(est, 1e-4))))
        replay = adapter.graph(k)  # type: ignore[attr-defined]
        text = f"CUDA graph of {k} calls per sample, held stream" + (", L2 flushed between replays" if l2_flush else "")
        return HeldSampler(adapter, replay, l2_flush, divisor=k), text, 50
    text = "CUDA events per call, stream held by a spin kernel while each batch is enqueued"
    return HeldSampler(adapter, None, l2_flush), text, 100


def _visible_index(ordinal: int | None) -> int | None:
    """NVML's index for CUDA device ``ordinal`` from CUDA_VISIBLE_DEVICES (numbers only), else the ordinal."""
    if ordinal is None:
        return None
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and ordinal < len(visible) and visible[ordinal].isdigit():
        return int(visible[ordinal])
    return ordinal
