"""Worker side: the timing methods, each giving microseconds per call.

* ``kernelbench``: ``warmup_calls`` calls, then ``perf_trials`` calls, each between an event pair
  on the current stream with a synchronisation after it (KernelBench's
  ``time_execution_with_cuda_event``).
* ``gpumode``: calls for ``warmup_s``, then timed calls (event pair, synchronised) until the
  relative standard error of the mean is under ``max_rel_err`` (``min_runs`` to ``max_runs``
  runs, ``max_case_s`` at most).
* ``bench``: :func:`krex_lab.bench` (held stream, L2 flush, noise criterion), samples as given.
* ``device-sync``: the second opinion, a device-wide synchronisation before and after each call,
  read on the host clock: work on a side stream (or in another thread the event pair never saw)
  is inside it.

Without a CUDA device (the CPU, the fake backend) every method reads the host clock around a
call and a synchronisation, and says so (``host-clock``): never a GPU time.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from .options import Options
from .outcomes import SampleStats
from .tensors import synchronize

__all__ = ["TimingError", "agree", "cuda_device", "stats", "time_calls"]

Call = Callable[[], Any]


class TimingError(Exception):
    """The timed program failed while being timed (its message says how)."""


def cuda_device() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available())


def stats(samples_us: list[float]) -> SampleStats:
    """KernelBench's runtime_stats (mean, std, min, max, num_trials) plus GPU MODE's err."""
    n = len(samples_us)
    mean = statistics.fmean(samples_us) if n else float("nan")
    std = statistics.stdev(samples_us) if n > 1 else 0.0
    return SampleStats(
        mean=round(mean, 4),
        std=round(std, 4),
        min=round(min(samples_us), 4) if n else float("nan"),
        max=round(max(samples_us), 4) if n else float("nan"),
        num_trials=n,
        err=round(std / math.sqrt(n), 4) if n > 1 else 0.0,
    )


def _event_timer() -> Callable[[Call], float]:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def once(fn: Call) -> float:
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return float(start.elapsed_time(end)) * 1e3

    return once


def _sync_timer(fn: Call) -> float:
    synchronize()
    t0 = time.perf_counter()
    fn()
    synchronize()
    return (time.perf_counter() - t0) * 1e6


def time_calls(
    fn: Call, method: str, options: Options, check: Callable[[Any], None] | None = None
) -> tuple[str, list[float]]:
    """(what timed it, samples in µs) of ``fn`` by ``method`` (``kernelbench``, ``gpumode``,
    ``bench`` or ``device-sync``). ``check``: called with each run's result (GPU MODE's
    leaderboard mode checks every run)."""
    gpu = cuda_device()
    if method == "bench":
        return _bench(fn, gpu)
    once = _event_timer() if gpu and method != "device-sync" else _sync_timer
    name = f"{method}-events" if gpu and method != "device-sync" else ("device-sync" if gpu else "host-clock")
    samples: list[float] = []

    def run() -> float:
        value: list[Any] = []
        us = once(lambda: value.append(fn()))
        if check is not None:
            check(value[0])
        return us

    if method == "gpumode":
        t_end = time.perf_counter() + options.warmup_s
        fn()
        while time.perf_counter() < t_end:
            fn()
        synchronize()
        deadline = time.perf_counter() + options.max_case_s
        while len(samples) < options.max_runs:
            samples.append(run())
            n = len(samples)
            if n >= options.min_runs:
                mean = statistics.fmean(samples)
                err = statistics.stdev(samples) / math.sqrt(n) if n > 1 else 0.0
                if mean > 0 and err / mean < options.max_rel_err:
                    break
            if time.perf_counter() > deadline and n >= min(options.min_runs, 1):
                break
        return name, samples
    for _ in range(max(0, options.warmup_calls)):
        fn()
    synchronize()
    trials = options.perf_trials if method != "device-sync" else max(10, options.perf_trials // 4)
    for _ in range(max(1, trials)):
        samples.append(run())
    return name, samples


def _bench(fn: Call, gpu: bool) -> tuple[str, list[float]]:
    from ..bench import bench

    m = bench(fn, framework="torch" if gpu else "host", exclusive=True, name="evaluate")
    return ("bench" if m.gpu_timed else "bench-host-clock"), [s * 1e3 for s in m.samples]


def agree(method_us: float, sync_us: float) -> bool:
    """Whether a device-wide figure confirms the method's: the synchronisation adds launch and
    wake-up latency (tens of µs), never a multiple of the work; a side stream's or another
    thread's work shows as a device-wide time far above the method's."""
    return not (sync_us > 1.5 * method_us + 50.0)
