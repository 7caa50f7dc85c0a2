"""The measurement harness without a GPU: statistics, nvbench's stopping rule, throttle discards, the
held-stream sampler and ``krex_lab.bench`` on host callables (with and without a region)."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import krex_lab
from krex_lab.bench import stats
from krex_lab.bench.detect import detect
from krex_lab.bench.measurement import Measurement, compare
from krex_lab.bench.throttle import ClockLog, ClockReading, throttle_cause
from krex_lab.bench.timing import HeldSampler, batch_size, collect, warm_up
from krex_lab.pytest_plugin import ArbiterProc


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


class StreamSampler:
    """Samples from a generator; each sample advances the fake wall clock by its own duration."""

    def __init__(self, values: Any, clock: FakeClock) -> None:
        self.values, self.clock, self.redone = iter(values), clock, 0
        self.batches: list[list[float]] = []

    def batch(self, count: int) -> list[float]:
        out = [next(self.values) for _ in range(count)]
        self.clock.t += sum(out) / 1e3
        self.batches.append(out)
        return out


class FakeClocks:
    """NVML readings scripted per call of read(); reference 1980 MHz."""

    reference_mhz = 1980.0

    def __init__(self, script: Any) -> None:
        self.script = iter(script)

    def read(self) -> ClockReading:
        sm, reasons = next(self.script, (1980, 0))
        return ClockReading(sm, 3201, reasons)

    def close(self) -> None:
        pass


# -- statistics ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.001, 1e4), min_size=1, max_size=200))
def test_summary_matches_numpy(xs: list[float]) -> None:
    s = stats.summarize(xs)
    assert s.n == len(xs)
    assert s.median == pytest.approx(float(np.median(xs)), rel=1e-9)
    assert s.p5 == pytest.approx(float(np.percentile(xs, 5)), rel=1e-9)
    assert s.p95 == pytest.approx(float(np.percentile(xs, 95)), rel=1e-9)
    assert s.mean == pytest.approx(float(np.mean(xs)), rel=1e-9)
    assert s.min <= s.p5 <= s.median <= s.p95 <= s.max
    if len(xs) > 1:
        assert s.rel_stdev == pytest.approx(float(np.std(xs, ddof=1) / np.mean(xs)), rel=1e-6, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.01, 100), min_size=2, max_size=300))
def test_running_noise_equals_batch_noise(xs: list[float]) -> None:
    c = stats.Convergence(stats.Criterion())
    c.extend(xs)
    assert c.noise == pytest.approx(stats.summarize(xs).rel_stdev, rel=1e-6, abs=1e-12)
    assert c.total_s == pytest.approx(sum(xs) / 1e3)


def test_empty_summary_is_nan_and_bad_samples_are_refused() -> None:
    assert math.isnan(stats.summarize([]).median)
    c = stats.Convergence()
    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(ValueError):
            c.add(bad)
    with pytest.raises(ValueError):
        stats.Criterion(min_samples=0)


# -- the stopping rule on synthetic streams --------------------------------------------------


def run(values: Any, criterion: stats.Criterion, batch: int = 1, script: Any = ()) -> tuple[Any, FakeClock]:
    clock = FakeClock()
    sampler = StreamSampler(values, clock)
    log = ClockLog(FakeClocks(script))
    got = collect(sampler, criterion, batch, log, clock=clock, sleep=clock.sleep)
    return got, clock


def test_quiet_stream_stops_on_noise_only_after_min_samples_and_min_time() -> None:
    rng = np.random.default_rng(1)
    quiet = (1.0 + 0.001 * rng.standard_normal() for _ in range(10**6))  # 0.1 % noise, 1 ms samples
    got, _ = run(quiet, stats.Criterion())
    assert got.stop_reason == "noise"
    assert got.state.n == 501, "min_time 0.5 s of 1 ms samples: the 501st sample crosses it"
    short = (5.0 + 0.001 * rng.standard_normal() for _ in range(10**6))
    got, _ = run(short, stats.Criterion(min_time=0.0))
    assert got.state.n == 10, "min_samples"


def test_noisy_stream_stops_once_its_noise_has_settled() -> None:
    rng = np.random.default_rng(2)
    noisy = (1.0 + 0.05 * rng.standard_normal() for _ in range(10**6))  # 5 % noise never gets under 0.5 %
    got, clock = run(noisy, stats.Criterion())
    assert got.stop_reason == "stable"
    assert 501 <= got.state.n < 2000 and clock.t < 15
    assert got.state.noise == pytest.approx(0.05, rel=0.2)


def test_drifting_stream_times_out_unconverged() -> None:
    drift = (1.0 + 0.01 * i for i in range(10**6))  # the noise keeps growing: never settles
    got, clock = run(drift, stats.Criterion(timeout=3.0))
    assert got.stop_reason == "timeout" and clock.t > 3.0
    assert any("noise" in s and "above max_noise" in s for s in got.state.shortfalls())
    m = Measurement.from_samples("drift", "host", "synthetic", got.state.samples, stop_reason=got.stop_reason)
    assert not m.converged and "not converged (noise 4" in m.summary() and "stopped by timeout" in m.summary()


def test_max_samples_caps_a_batch() -> None:
    got, _ = run(iter([1.0] * 100), stats.Criterion(min_samples=5, max_samples=7, min_time=0.0), batch=4)
    assert got.state.n == 7 and got.stop_reason == "noise", "the second batch is cut to the 3 samples left"
    got, _ = run(
        (1.0 + 0.01 * (i % 2) for i in range(100)),
        stats.Criterion(min_samples=5, max_samples=7, min_time=10.0),
        batch=4,
    )
    assert got.state.n == 7 and got.stop_reason == "max_samples"


def test_throttled_batches_are_discarded_and_counted() -> None:
    # Batches of 4: normal samples 1.0 ms; batches 3 and 4 run while throttled and come out slower.
    def values() -> Any:
        for b in range(10**5):
            yield from [2.5 if b in (2, 3, 6) else 1.0] * 4

    # two reads per batch (before, after): batch 3 is slow by clock, batch 4 by a thermal slowdown,
    # batch 7 by the power brake seen only after it; gpu_idle and the software power cap do not count.
    script = (
        [(1980, 0x001), (1980, 0x004)] * 2
        + [(1200, 0), (1980, 0)]
        + [(1980, 0x020), (1980, 0)]
        + [(1980, 0), (1980, 0)] * 2
        + [(1980, 0), (1980, 0x080)]
    )
    got, clock = run(values(), stats.Criterion(min_samples=20, min_time=0.0, max_noise=0.001), batch=4, script=script)
    st_ = got.state
    assert st_.discarded == 12 and got.throttled_batches == 3
    assert dict(st_.discard_reasons) == {
        "sm_clock_below_75%": 4,
        "sw_thermal_slowdown": 4,
        "hw_power_brake_slowdown": 4,
    }
    assert 2.5 not in st_.samples and st_.n == 20
    assert clock.slept == [0.05, 0.05, 0.05], "nvbench's recovery pause after each throttled batch"


def test_recovery_pause_grows_when_throttling_persists() -> None:
    script = [(900, 0)] * 20  # throttled for 10 batches, then normal
    got, clock = run(iter([1.0] * 1000), stats.Criterion(min_samples=3, min_time=0.0), batch=1, script=script)
    assert got.state.discarded == 10
    assert clock.slept[:3] == [0.05] * 3 and clock.slept[3] > 0.05
    assert all(b >= a for a, b in zip(clock.slept, clock.slept[1:]))
    assert all(b - a <= 0.5 + 1e-9 for a, b in zip(clock.slept, clock.slept[1:]))


def test_all_throttled_times_out_with_nothing_kept() -> None:
    got, _ = run(iter([1.0] * 10**5), stats.Criterion(timeout=1.0), batch=10, script=iter(lambda: (100, 0), None))
    assert got.stop_reason == "timeout" and got.state.n == 0 and got.state.discarded > 0


def test_throttle_rule() -> None:
    ok = ClockReading(1980, 3201, 0)
    assert throttle_cause(ok, 1980) is None
    assert throttle_cause(ClockReading(1980, 3201, 0x001 | 0x004 | 0x002), 1980) is None
    assert throttle_cause(ClockReading(1700, 3201, 0x004), 1980) is None, "power cap above 75 %: kept"
    assert throttle_cause(ClockReading(1400, 3201, 0x004), 1980) == "sm_clock_below_75%"
    assert throttle_cause(ClockReading(1980, 3201, 0x008), 1980) == "hw_slowdown"
    assert throttle_cause(ClockReading(1980, 3201, 0x040 | 0x001), 1980) == "hw_thermal_slowdown"
    assert throttle_cause(ClockReading(None, None, None), 1980) is None
    assert throttle_cause(ClockReading(1000, 3201, 0), None) is None, "no reference: no clock rule"

    class NoMax(FakeClocks):
        reference_mhz = None

    log = ClockLog(NoMax([(1980, 0), (1000, 0)]))
    assert log.cause(log.read()) is None
    assert log.cause(log.read()) == "sm_clock_below_75%", "the highest clock seen is the reference"
    summary = log.summary()
    assert summary["sm_mhz_min"] == 1000 and summary["sm_mhz_max"] == 1980 and summary["readings"] == 2
    assert ClockLog(None).read() is None and ClockLog(None).summary() == {"source": None}


def test_batch_size_and_warm_up() -> None:
    assert batch_size(0.05) == 100 and batch_size(1.0) == 10 and batch_size(50.0) == 1
    assert batch_size(float("nan")) == 100 and batch_size(0.3, limit=8) == 8
    clock = FakeClock()
    sampler = StreamSampler(iter([100.0] + [1.0] * 10**4), clock)  # the first call compiles
    w = warm_up(sampler, 0.2, clock)
    assert w.estimate_ms == 1.0 and w.seconds >= 0.2 and w.calls >= 2
    assert [len(b) for b in sampler.batches][:4] == [1, 1, 2, 4]


# -- the held-stream sampler on a fake device timeline -----------------------------------------


class TimelineAdapter:
    """A stream as a timeline: spin/flush/call advance it, events take its time stamp."""

    calibration_units = 10_000

    def __init__(self, kernel_ms: float, early: int = 0) -> None:
        self.now, self.kernel_ms, self.early = 0.0, kernel_ms, early
        self.flushes = 0
        self.prepared = False

    class Event:
        t = 0.0

    def event(self) -> Any:
        return self.Event()

    def stream_context(self) -> Any:
        return contextlib.nullcontext()

    def record(self, ev: Any) -> None:
        ev.t = self.now

    def spin(self, units: int) -> None:
        self.now += units / 1000.0  # 1000 units per ms

    def call(self) -> None:
        self.now += self.kernel_ms

    def prepare_flush(self) -> None:
        self.prepared = True

    def flush(self) -> None:
        self.flushes += 1
        self.now += 0.5

    def done(self, ev: Any) -> bool:  # the spin ended before the batch was enqueued, `early` times
        if self.early:
            self.early -= 1
            return True
        return False

    def wait(self, ev: Any) -> None:
        pass

    def elapsed_ms(self, a: Any, b: Any) -> float:
        return float(b.t - a.t)


def test_held_sampler_times_only_the_call_and_redoes_unheld_batches() -> None:
    ad = TimelineAdapter(kernel_ms=0.25, early=2)
    s = HeldSampler(ad, l2_flush=True)
    assert s.units_per_ms == pytest.approx(1000.0) and ad.prepared
    out = s.batch(5)
    assert out == pytest.approx([0.25] * 5), "the flush before each call stays outside its interval"
    assert s.redone == 2 and ad.flushes == 15, "two batches redone because the spin ended too early"
    graph = HeldSampler(TimelineAdapter(kernel_ms=2.0), l2_flush=False, divisor=8)
    assert graph.batch(3) == pytest.approx([0.25] * 3)


class QueueAdapter:
    """A host and a GPU stream on two clocks, as the driver runs them: every API call costs the
    host ``host_ms``; an operation starts on the GPU when the host has enqueued it and the stream is
    free; an event takes the GPU's time then, and is done once the host's clock has passed it.
    ``stalls`` maps the index of a host call to a pause before it (the host preempted)."""

    calibration_units = 10_000

    def __init__(self, kernel_ms: float, host_ms: float = 0.01, stalls: dict[int, float] | None = None) -> None:
        self.kernel_ms, self.host_ms = kernel_ms, host_ms
        self.stalls = stalls or {}
        self.host = self.gpu = 0.0
        self.calls = 0
        self.gpu_busy = 0.0

    class Event:
        t = math.inf

    def _host(self) -> None:
        self.host += self.stalls.get(self.calls, 0.0) + self.host_ms
        self.calls += 1

    def _run(self, ms: float) -> float:
        self._host()
        start = max(self.gpu, self.host)
        self.gpu = start + ms
        self.gpu_busy += ms
        return start

    def event(self) -> Any:
        return self.Event()

    def stream_context(self) -> Any:
        return contextlib.nullcontext()

    def record(self, ev: Any) -> None:
        ev.t = self._run(0.0)

    def spin(self, units: int) -> None:
        self._run(units / 1000.0)  # 1000 units per ms

    def call(self) -> None:
        self._run(self.kernel_ms)

    def prepare_flush(self) -> None:
        pass

    def flush(self) -> None:
        self._run(0.02)

    def done(self, ev: Any) -> bool:
        self._host()
        return bool(ev.t <= self.host)

    def wait(self, ev: Any) -> None:
        self.host = max(self.host, ev.t)

    def elapsed_ms(self, a: Any, b: Any) -> float:
        return float(b.t - a.t)


def test_held_sampler_holds_the_stream_only_as_long_as_the_gpu_could_catch_up() -> None:
    # A 0.25 ms kernel, 10 us a host call: the GPU never waits for the host after the first
    # sample, so the spin is a sliver of the batch. The hold was twice the batch's enqueue time
    # (a third of a 0.24 ms kernel's region on the H200, 2026-12-01).
    ad = QueueAdapter(kernel_ms=0.25)
    s = HeldSampler(ad, l2_flush=True)
    busy_before = ad.gpu_busy
    out = [t for _ in range(20) for t in s.batch(40)]
    assert out == pytest.approx([0.25] * 800), "no host time inside an interval"
    assert s.redone == 0
    assert s.hold_ms == pytest.approx(0.3), "the hold settles at its floor"
    assert s.spin_ms < 0.05 * (ad.gpu_busy - busy_before), (s.spin_ms, ad.gpu_busy - busy_before)


def test_held_sampler_redoes_a_batch_the_gpu_caught_up_with() -> None:
    # The host is preempted for 10 ms between a start event and its call, mid-batch: longer than
    # the GPU's lead (20 samples of 0.25 ms, less the host's 50 us each), so that sample would
    # hold the stall. The batch is taken again; nothing returned holds it.
    ad = QueueAdapter(kernel_ms=0.25)
    s = HeldSampler(ad, l2_flush=True)
    s.batch(10)
    # the spin, then per sample: flush, start, call, end, query; the stall comes before call 20
    ad.stalls = {ad.calls + 1 + 5 * 20 + 2: 10.0}
    out = s.batch(40)
    assert out == pytest.approx([0.25] * 40) and s.redone == 1
    assert s.floor_ms > 0.3


def test_held_sampler_covers_the_whole_enqueue_when_the_gpu_is_faster_than_the_host() -> None:
    # A 2 us kernel against 10 us host calls: the GPU would wait at every sample. The hold grows
    # until the batch is enqueued under it, and stays there (no redo in every batch after).
    ad = QueueAdapter(kernel_ms=0.002)
    s = HeldSampler(ad, l2_flush=False)
    out = [t for _ in range(30) for t in s.batch(20)]
    assert out == pytest.approx([0.002] * 600)
    first = s.redone
    assert first >= 1
    for _ in range(30):
        s.batch(20)
    assert s.redone - first <= 3, "the hold must not fall back under what the GPU outran"


# -- bench() and friends on host callables ----------------------------------------------------


def busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


FAST = {"min_samples": 5, "min_time": 0.01, "timeout": 2.0, "warmup": 0.01, "max_noise": 0.5}


def test_bench_host_callable_without_region() -> None:
    m = krex_lab.bench(busy, 0.2, exclusive=False, **FAST)
    assert isinstance(m, Measurement) and m.framework == "host" and not m.simulated
    # converged means the noise criterion was met (a loaded machine may preempt the busy loop)
    assert m.converged == (m.rel_stdev < FAST["max_noise"]) and m.n >= 5 and m.region is None
    assert 0.19 < m.median < 1.0 and m.p5 <= m.median <= m.p95
    d = m.to_dict()
    json.dumps(d)
    assert d["n_samples"] == m.n and d["samples"] == m.samples and "samples" not in m.to_dict(samples=False)
    assert "median" in m._repr_html_() and "no region" in m._repr_html_()
    other = krex_lab.bench(busy, 0.4, exclusive=False, name="slower", **FAST)
    table = compare(m, other)
    assert table.rows()[1]["speedup"] == pytest.approx(other.speedup_over(m)) and other.speedup_over(m) < 1
    assert "slower" in repr(table) and "<table>" in table._repr_html_()


def test_bench_runs_inside_a_region(arbiter: ArbiterProc) -> None:
    m = krex_lab.bench(busy, 0.1, **FAST)
    assert m.region is not None and m.region["region"] and m.region["simulated"] is True
    assert "hold_s" in m.region, "the report after release"
    with krex_lab.exclusive() as region:  # inside the caller's own region: bench uses it
        inner = krex_lab.bench(busy, 0.1, **FAST)
    assert inner.region is not None and inner.region["nested"] and inner.region["region"] == region.id


def test_only_the_sampling_holds_the_region(arbiter: ArbiterProc) -> None:
    # The warm-up (compile, allocation, clocks: 0.2 s by default) shares the GPU; a region held
    # over it kept every other agent off the GPU for nothing (agent_study.py, H200, 2026-12-01).
    opts = {**FAST, "warmup": 0.4}
    m = krex_lab.bench(busy, 0.1, **opts)
    assert m.region is not None and m.phases["warmup_s"] >= 0.4
    assert m.region["hold_s"] < 0.4, (m.region["hold_s"], m.phases)
    assert m.phases["sampling_s"] > 0 and "settle_s" in m.phases and m.to_dict()["phases"] == m.phases
    held = krex_lab.bench(busy, 0.1, exclusive_warmup=True, **opts)
    assert held.region is not None and held.region["hold_s"] >= 0.4 and "settle_s" not in held.phases


def test_bench_options_are_checked() -> None:
    with pytest.raises(ValueError, match="method"):
        krex_lab.bench(busy, 0.1, exclusive=False, method="magic")
    with pytest.raises(ValueError, match="framework"):
        krex_lab.bench(busy, 0.1, exclusive=False, framework="jax")
    with pytest.raises(ValueError, match="graph"):
        krex_lab.bench(busy, 0.1, exclusive=False, method="graph")


def test_framework_detection() -> None:
    def fake(module: str, **attrs: Any) -> Any:
        cls = type("Array", (), {"__module__": module, **attrs})
        return cls()

    torch_t, cupy_a, numba_a = fake("torch", is_cuda=True), fake("cupy._core.core"), fake("numba.cuda.devicearray")
    assert detect(print, [np.zeros(3)]) == "host"
    assert detect(print, [fake("torch", is_cuda=False)]) == "host"
    assert detect(print, [torch_t]) == "torch" and detect(print, [cupy_a]) == "cupy"
    assert detect(print, [numba_a]) == "numba"
    assert detect(functools.partial(print, torch_t), []) == "torch", "arguments bound by a partial count"
    assert detect(functools.partial(print, out=cupy_a), []) == "cupy"
    with pytest.raises(ValueError, match="uses cupy and torch arrays"):
        detect(print, [torch_t, cupy_a])
    launch = fake("numba.cuda.dispatcher")
    assert detect(launch, []) == "numba"
    assert detect(launch, [np.zeros(3)]) == "host", "host arrays: numba copies synchronously, the host clock times it"
    captured = (numba_a, numba_a)
    assert detect(lambda: print(*captured), []) == "numba", "arrays the closure holds count"
    assert detect(lambda: print(GLOBAL_TENSORS), []) == "torch", "arrays in the globals it names count"


GLOBAL_TENSORS = {"x": type("T", (), {"__module__": "torch", "is_cuda": True})()}


def test_a_callable_without_arrays_needs_framework_when_a_gpu_framework_is_in_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import krex_lab.bench.detect as detection

    assert detect(lambda: None, []) == "host"
    monkeypatch.setattr(detection, "_gpu_frameworks_in_use", lambda: ["torch"])
    with pytest.raises(ValueError, match="pass framework="):
        detect(lambda: None, [])
    assert detect(lambda: None, [np.zeros(2)]) == "host"


def test_lazy_public_names_and_cheap_import() -> None:
    code = (
        "import sys, krex_lab\n"
        "assert not any(m in sys.modules for m in ('numpy', 'numba', 'torch', 'zmq')), sys.modules.keys()\n"
        "assert callable(krex_lab.bench) and krex_lab.bench.compare\n"
        "assert krex_lab.Measurement.__name__ == 'Measurement' and callable(krex_lab.check)\n"
        "assert 'numpy' not in sys.modules, 'importing the harness imports no numpy'\n"
        "assert {'bench', 'check', 'Measurement'} <= set(krex_lab.__all__)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
