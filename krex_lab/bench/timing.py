"""Samplers (how one batch of samples is taken) and the loop that runs them to convergence.

:class:`HeldSampler` is the method proven on the H200 (benchmarks/regions/fidelity_roles.py,
fidelity-2026-11-29.json): a spin kernel holds the stream while a whole batch is enqueued —
for each sample an L2 flush, a start event, the call, an end event — so the GPU never waits
for the host: host launch latency stays out of every interval. Right after each sample's end
event is enqueued the host asks whether its start event has run yet: if it has, the GPU may
have waited for the host inside that interval, and the batch is redone with a longer hold. The
hold therefore only has to cover the first samples' enqueue while the GPU is slower than the
host (0.3 ms, not twice the whole batch's enqueue time: that was a third of a 0.24 ms kernel's
region on the H200, 2026-12-01); it grows only where the GPU catches up (tiny kernels, a
preempted host). With ``divisor=K`` and a CUDA graph of K calls as the call, it is the graph
method (per-call time = replay time / K; L2 is flushed between replays, not inside one).

:class:`HostSampler` times a call with ``time.perf_counter`` (NumPy, numba's simulator).

:func:`collect` is framework-neutral: batches from a sampler, a clock check before and after
each (a throttled batch is discarded and counted, then the loop pauses as nvbench does), and
:class:`~krex_lab.bench.stats.Convergence` deciding when to stop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .stats import Convergence, Criterion
from .throttle import ClockLog

MAX_HOLD_MS = 200.0
MIN_HOLD_MS = 0.3
MAX_BATCH = 100


class Sampler(Protocol):
    redone: int

    def batch(self, count: int) -> list[float]:
        """``count`` samples, in milliseconds."""


class HostSampler:
    """Wall time of ``call(); sync()`` on the host clock."""

    def __init__(self, call: Callable[[], None], sync: Callable[[], None] = lambda: None) -> None:
        self.call, self.sync = call, sync
        self.redone = 0

    def batch(self, count: int) -> list[float]:
        out = []
        for _ in range(count):
            t0 = time.perf_counter()
            self.call()
            self.sync()
            out.append((time.perf_counter() - t0) * 1e3)
        return out


class HeldSampler:
    """Event pairs around each call, enqueued while a spin kernel holds the stream (see module doc)."""

    def __init__(
        self, adapter: Any, call: Callable[[], None] | None = None, l2_flush: bool = True, divisor: int = 1
    ) -> None:
        self.ad = adapter
        self.call = call or adapter.call
        self.l2_flush = l2_flush
        self.divisor = divisor
        self.redone = 0
        self.hold_ms = 1.0
        #: a hold at least this long: 1.25 x the longest one the GPU outran (never lowered)
        self.floor_ms = MIN_HOLD_MS
        #: spin time asked for so far (GPU time spent holding the stream), for the phases report
        self.spin_ms = 0.0
        self.pairs: list[tuple[Any, Any]] = []
        if l2_flush:
            adapter.prepare_flush()
        self.units_per_ms = self.calibrate()

    def calibrate(self) -> float:
        """Spin units per millisecond of the adapter's spin kernel, measured with events."""
        ad = self.ad
        start, end = ad.event(), ad.event()
        units = int(ad.calibration_units)
        for _ in range(4):
            with ad.stream_context():
                ad.spin(units // 10)  # wakes the clocks first; not timed
                ad.record(start)
                ad.spin(units)
                ad.record(end)
            ad.wait(end)
            ms = ad.elapsed_ms(start, end)
            if ms >= 2.0:
                break
            units = int(units * min(20.0, 10.0 / max(ms, 0.05)))
        return units / max(ms, 1e-3)

    def batch(self, count: int) -> list[float]:
        ad = self.ad
        while len(self.pairs) < count:
            self.pairs.append((ad.event(), ad.event()))
        pairs = self.pairs[:count]
        for _ in range(100):
            caught = False
            with ad.stream_context():
                ad.spin(int(self.hold_ms * self.units_per_ms))
                for start, end in pairs:
                    if self.l2_flush:
                        ad.flush()
                    ad.record(start)
                    self.call()
                    ad.record(end)
                    # Has the GPU reached this start already? Then it may have waited for the
                    # call's launch inside the interval. Not yet: start, call and end run back to back.
                    caught = caught or ad.done(start)
            self.spin_ms += self.hold_ms
            ad.wait(pairs[-1][1])
            if caught:
                self.redone += 1
                self.floor_ms = min(MAX_HOLD_MS, max(self.floor_ms, 1.25 * self.hold_ms))
                self.hold_ms = min(MAX_HOLD_MS, max(self.floor_ms, 2 * self.hold_ms))
                continue
            self.hold_ms = max(self.floor_ms, 0.8 * self.hold_ms)
            return [ad.elapsed_ms(s, e) / self.divisor for s, e in pairs]
        raise RuntimeError(
            f"could not hold the stream over a batch of {count} calls 100 times "
            f"(hold {self.hold_ms:.1f} ms): the host enqueues too slowly"
        )


@dataclass
class Warmup:
    calls: int
    seconds: float
    estimate_ms: float


def warm_up(sampler: Sampler, seconds: float, clock: Callable[[], float] = time.monotonic) -> Warmup:
    """Run for ``seconds`` of wall time (at least two calls; the first compiles and allocates),
    doubling batches up to 64; the last batch's median estimates one sample."""
    t0 = clock()
    last = sampler.batch(1)
    calls, size = 1, 1
    while calls < 2 or clock() - t0 < seconds:
        last = sampler.batch(size)
        calls += size
        size = min(size * 2, 64)
    ordered = sorted(last)
    return Warmup(calls=calls, seconds=clock() - t0, estimate_ms=ordered[len(ordered) // 2])


def batch_size(estimate_ms: float, batch_ms: float = 10.0, limit: int = MAX_BATCH) -> int:
    """Samples per batch: about ``batch_ms`` of GPU time, between 1 and ``limit``."""
    if not math.isfinite(estimate_ms) or estimate_ms <= 0:
        return limit
    return max(1, min(limit, math.ceil(batch_ms / estimate_ms)))


@dataclass
class Collected:
    state: Convergence
    stop_reason: str
    seconds: float
    batches: int
    throttled_batches: int


def collect(
    sampler: Sampler,
    criterion: Criterion,
    batch: int,
    clocks: ClockLog | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    recovery_delay: float = 0.05,
) -> Collected:
    """Sample in batches until ``criterion`` says stop; throttled batches are discarded and counted.

    After a throttled batch the loop pauses ``recovery_delay`` seconds (nvbench: 0.05 s, growing
    by up to 0.5 s per pause from the fourth throttled batch in a row).
    """
    state = Convergence(criterion)
    t0 = clock()
    batches = throttled = in_a_row = 0
    delay = recovery_delay
    while True:
        room = criterion.max_samples - state.n
        before = clocks.read() if clocks else None
        times = sampler.batch(max(1, min(batch, room)))
        after = clocks.read() if clocks else None
        batches += 1
        why = clocks.cause(before, after) if clocks else None
        if why:
            throttled += 1
            state.discard(len(times), why)
            if in_a_row > 2:  # nvbench: a fourth throttled batch in a row pauses longer
                delay += min(delay * 1.5, 0.5)
            in_a_row += 1
            if delay > 0:
                sleep(delay)
        else:
            in_a_row = 0
            state.extend(times)
        reason = state.stop_reason(clock() - t0)
        if reason:
            return Collected(state, reason, clock() - t0, batches, throttled)
