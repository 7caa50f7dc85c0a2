"""``Measurement``: what :func:`krex_lab.bench` returns (times in milliseconds), and ``compare``."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from ..region_report import RegionReport
from .frameworks import DeviceDict
from .stats import CONVERGED, CriterionDict, noise_met, summarize
from .throttle import ClockSummary

#: said wherever a measurement shows that its times are host times (no GPU work was timed)
NO_GPU = "no GPU was timed"


def fmt_ms(ms: float) -> str:
    """A time in a readable unit: ``12.3 µs``, ``1.234 ms``, ``1.20 s``."""
    if not math.isfinite(ms):
        return "n/a"
    if ms < 1.0:
        return f"{ms * 1e3:.4g} µs"
    if ms < 1000.0:
        return f"{ms:.4g} ms"
    return f"{ms / 1e3:.3g} s"


class WarmupDict(TypedDict):
    """How a measurement warmed the callable up (its ``warmup``)."""

    calls: int
    seconds: float
    estimate_ms: float


class _MeasurementFields(TypedDict):
    name: str
    unit: str
    median: float
    p5: float
    p95: float
    mean: float
    min: float
    max: float
    rel_stdev: float
    n_samples: int
    discarded: int
    discard_reasons: dict[str, int]
    redone_batches: int
    converged: bool
    stop_reason: str
    framework: str
    method: str
    simulated: bool
    gpu_timed: bool
    l2_flush: bool
    batch: int
    wall_s: float
    warmup: WarmupDict
    phases: dict[str, float]
    clocks: ClockSummary
    device: DeviceDict
    region: dict[str, Any] | None
    degraded: bool
    criterion: CriterionDict
    warnings: list[str]


class MeasurementDict(_MeasurementFields, total=False):
    """A :class:`Measurement` as plain data (:meth:`Measurement.to_dict`): agents and result files."""

    #: left out with ``samples=False``
    samples: list[float]


def _not_measured() -> Any:
    # A Measurement built by hand (``from_samples`` without a bench run) measured no warm-up, clocks,
    # device or criterion: those stay empty, as they always have in its ``to_dict``.
    return {}


class MeasurementRow(TypedDict):
    """What :meth:`Measurement.row` gives a table or a result file (times in milliseconds)."""

    median_ms: float
    p5_ms: float
    p95_ms: float
    noise: float
    samples: int
    discarded: int
    simulated: bool
    gpu_timed: bool
    converged: bool
    degraded: bool


@dataclass
class Measurement:
    """One timed callable. Times (``median``, ``p5``, ``p95``, ``mean``, ``min``, ``max``,
    ``samples``) are in milliseconds; ``rel_stdev`` is the noise (0.004 = 0.4 %)."""

    name: str
    framework: str
    method: str
    samples: list[float]
    median: float
    p5: float
    p95: float
    mean: float
    min: float
    max: float
    rel_stdev: float
    #: samples taken while the GPU was throttled, left out of everything above
    discarded: int = 0
    discard_reasons: dict[str, int] = field(default_factory=dict)
    #: batches taken again because the spin kernel ended before the batch was enqueued
    redone_batches: int = 0
    stop_reason: str = ""
    converged: bool = False
    simulated: bool = False
    #: whether the times are GPU times (events on a stream); False: the host clock timed the call, so a
    #: plain Python callable, NumPy, or numba's simulator: nothing here says anything about a GPU
    gpu_timed: bool = False
    l2_flush: bool = True
    batch: int = 1
    wall_s: float = 0.0
    warmup: WarmupDict = field(default_factory=_not_measured)
    #: wall seconds by phase: setup_s, warmup_s, region_wait_s (acquiring the region), settle_s
    #: (its first batch, not kept), sampling_s; spin_s is GPU time spent holding the stream
    phases: dict[str, float] = field(default_factory=dict)
    clocks: ClockSummary = field(default_factory=_not_measured)
    device: DeviceDict = field(default_factory=_not_measured)
    #: the region's report, None with ``exclusive=False``
    region: RegionReport | None = None
    criterion: CriterionDict = field(default_factory=_not_measured)
    warnings: list[str] = field(default_factory=list)
    unit: str = "ms"

    def __post_init__(self) -> None:
        # A result timed in a degraded region is said to be, first, wherever it is shown.
        said = self._degraded_text()
        if said and said not in self.warnings:
            self.warnings.insert(0, said)

    @property
    def degraded(self) -> bool:
        """Whether the region these times were taken in was degraded (something not drained,
        frozen or isolated): other work may have disturbed them."""
        return self.region is not None and self.region.degraded

    def _degraded_text(self) -> str:
        if self.region is None or not self.region.degraded:
            return ""
        why = "; ".join(self.region.why_degraded()) or "no reason recorded"
        return f"DEGRADED region {self.region.region}: {why} (these times may be disturbed by other work)"

    @classmethod
    def from_samples(cls, name: str, framework: str, method: str, samples: list[float], **fields: Any) -> Measurement:
        s = summarize(samples)
        reason = fields.get("stop_reason", "")
        max_noise = fields.get("criterion", {}).get("max_noise")
        # Converged only when the noise criterion was met, whatever stopped the loop.
        met = max_noise is None or noise_met(s.rel_stdev, s.n, float(max_noise))
        return cls(
            name=name,
            framework=framework,
            method=method,
            samples=list(samples),
            median=s.median,
            p5=s.p5,
            p95=s.p95,
            mean=s.mean,
            min=s.min,
            max=s.max,
            rel_stdev=s.rel_stdev,
            converged=reason in CONVERGED and met,
            **fields,
        )

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def noise(self) -> float:
        return self.rel_stdev

    def speedup_over(self, other: Measurement) -> float:
        """How many times faster this is than ``other`` (ratio of medians)."""
        return other.median / self.median if self.median > 0 else math.nan

    def row(self) -> MeasurementRow:
        """The figures a table or a result file shows of it, times in ms (``median_ms``, ``p95_ms``, ...)."""
        return MeasurementRow(
            median_ms=self.median,
            p5_ms=self.p5,
            p95_ms=self.p95,
            noise=self.rel_stdev,
            samples=self.n,
            discarded=self.discarded,
            simulated=self.simulated,
            gpu_timed=self.gpu_timed,
            converged=self.converged,
            degraded=self.degraded,
        )

    def to_dict(self, samples: bool = True) -> MeasurementDict:
        """Plain JSON-able data (for agents and result files); ``samples=False`` leaves the raw samples out."""
        out: MeasurementDict = {
            "name": self.name,
            "unit": self.unit,
            "median": self.median,
            "p5": self.p5,
            "p95": self.p95,
            "mean": self.mean,
            "min": self.min,
            "max": self.max,
            "rel_stdev": self.rel_stdev,
            "n_samples": self.n,
            "discarded": self.discarded,
            "discard_reasons": dict(self.discard_reasons),
            "redone_batches": self.redone_batches,
            "converged": self.converged,
            "stop_reason": self.stop_reason,
            "framework": self.framework,
            "method": self.method,
            "simulated": self.simulated,
            "gpu_timed": self.gpu_timed,
            "l2_flush": self.l2_flush,
            "batch": self.batch,
            "wall_s": self.wall_s,
            "warmup": self.warmup.copy(),
            "phases": dict(self.phases),
            "clocks": self.clocks.copy(),
            "device": self.device.copy(),
            "region": self.region.to_dict() if self.region is not None else None,
            "degraded": self.degraded,
            "criterion": self.criterion.copy(),
            "warnings": list(self.warnings),
        }
        if samples:
            out["samples"] = list(self.samples)
        return out

    def _stop_text(self) -> str:
        """``converged (noise 0.21% < max_noise 0.50%)`` or ``not converged (noise 23.00% > max_noise 0.50%;
        it settled there)``: the noise and the bound it was held to, so the word is checkable."""
        noise = f"noise {self.rel_stdev:.2%}" if math.isfinite(self.rel_stdev) else "noise n/a"
        bound = self.criterion.get("max_noise")
        if self.converged:
            return f"converged ({noise}" + (f" < max_noise {bound:.2%})" if bound is not None else ")")
        why = {
            "stable": "it settled there",
            "timeout": "stopped by timeout",
            "max_samples": "stopped at max_samples",
        }.get(self.stop_reason, f"stopped: {self.stop_reason}" if self.stop_reason else "")
        above = f" > max_noise {bound:.2%}" if bound is not None and math.isfinite(self.rel_stdev) else ""
        return f"not converged ({noise}{above}" + (f"; {why})" if why else ")")

    def _host_text(self) -> str:
        """What the times are when no GPU was timed ('' when they are GPU times)."""
        if self.gpu_timed:
            return ""
        if self.simulated:
            return f"SIMULATED, {NO_GPU}: host time of numba's CUDA simulator"
        return f"{NO_GPU}: host clock around the call"

    def _region_text(self) -> str:
        if self.region is None:
            return "no region (exclusive=False)"
        r = self.region
        if r.nested:
            return f"inside region {r.region} (already held)"
        sim = " [simulated GPU]" if r.simulated else ""
        degraded = f" - {self._degraded_text()}" if r.degraded else ""
        return (
            f"region {r.region} on GPU {r.gpu}{sim}: frozen {len(r.frozen)}, "
            f"drained {len(r.drained)}, cores {r.cores}{degraded}"
        )

    def summary(self) -> str:
        host = self._host_text()
        sim = f" [{host}]" if host else ""
        degraded = f"{self._degraded_text()}; " if self.degraded else ""
        return (
            f"{self.name}: {degraded}median {fmt_ms(self.median)} (p5 {fmt_ms(self.p5)}, p95 {fmt_ms(self.p95)}), "
            f"noise {self.rel_stdev:.2%}, {self.n} samples, {self.discarded} discarded (throttled), "
            f"{self._stop_text()}; {self.framework}, {self.method}{sim}"
        )

    def __repr__(self) -> str:
        return f"<Measurement {self.summary()}>"

    def _repr_html_(self) -> str:
        e = html.escape
        rows = [
            ("median", fmt_ms(self.median)),
            ("p5 / p95", f"{fmt_ms(self.p5)} / {fmt_ms(self.p95)}"),
            ("mean", fmt_ms(self.mean)),
            ("noise (rel. stdev)", f"{self.rel_stdev:.2%}"),
            ("samples", f"{self.n} kept, {self.discarded} discarded (throttled)"),
            ("stopped", self._stop_text()),
            ("timing", f"{self.framework}: {self.method}"),
            ("GPU timed", "yes (events on the stream)" if self.gpu_timed else f"no: {self._host_text()}"),
            ("L2 flush", "between samples" if self.l2_flush else "off"),
            ("device", str(self.device.get("name", ""))),
            ("region", self._region_text()),
        ]
        if self.clocks.get("sm_mhz_median"):
            rows.append(("SM clock", f"{self.clocks.get('sm_mhz_min')}-{self.clocks.get('sm_mhz_max')} MHz"))
        body = "".join(
            f"<tr><th style='text-align:left'>{e(k)}</th><td style='text-align:left'>{e(str(v))}</td></tr>"
            for k, v in rows
        )
        notes = list(self.warnings)
        if not self.gpu_timed and not any(NO_GPU in w for w in notes):
            notes.insert(0, self._host_text())
        warn = "".join(f"<div style='color:#b00'>⚠ {e(w)}</div>" for w in notes)
        return f"<div><b>{e(self.name)}</b><table>{body}</table>{warn}</div>"


class ComparisonRow(MeasurementRow):
    """One measurement of a :class:`Comparison`, named, with its ``speedup`` against the baseline."""

    name: str
    speedup: float


class ComparisonDict(TypedDict):
    """A :class:`Comparison` as plain data: the baseline's name and every row."""

    baseline: str
    rows: list[ComparisonRow]


class Comparison:
    """Several measurements side by side, with speed-ups against the first (the baseline)."""

    def __init__(self, measurements: Mapping[str, Measurement]) -> None:
        if not measurements:
            raise ValueError("compare() needs at least one measurement")
        self.measurements = dict(measurements)
        self.baseline = next(iter(self.measurements))

    def rows(self) -> list[ComparisonRow]:
        base = self.measurements[self.baseline]
        return [ComparisonRow(name=k, **m.row(), speedup=m.speedup_over(base)) for k, m in self.measurements.items()]

    def to_dict(self) -> ComparisonDict:
        return ComparisonDict(baseline=self.baseline, rows=self.rows())

    def _host_timed(self) -> list[str]:
        """The measurements whose times are host times of a real run (not simulated, no GPU timed)."""
        return [k for k, m in self.measurements.items() if not m.gpu_timed and not m.simulated]

    def __repr__(self) -> str:
        lines = [f"{'':24s} {'median':>12s} {'p95':>12s} {'noise':>7s} {'vs ' + self.baseline[:12]:>16s}"]
        for r in self.rows():
            lines.append(
                f"{r['name'][:24]:24s} {fmt_ms(r['median_ms']):>12s} {fmt_ms(r['p95_ms']):>12s} "
                f"{r['noise']:>7.2%} {r['speedup']:>15.2f}x"
            )
        if any(m.simulated for m in self.measurements.values()):
            lines.append("(simulated: host times of numba's CUDA simulator, not GPU times)")
        degraded = [name for name, m in self.measurements.items() if m.degraded]
        if degraded:
            lines.append(f"(DEGRADED region for {', '.join(degraded)}: these times may be disturbed)")
        host = self._host_timed()
        if host:
            lines.append(f"({NO_GPU} for {', '.join(host)}: host clock)")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        e = html.escape
        head = "".join(
            f"<th>{h}</th>" for h in ("", "median", "p5", "p95", "noise", "samples", f"speed-up vs {e(self.baseline)}")
        )
        body = "".join(
            f"<tr><th style='text-align:left'>{e(r['name'])}</th><td>{fmt_ms(r['median_ms'])}</td>"
            f"<td>{fmt_ms(r['p5_ms'])}</td><td>{fmt_ms(r['p95_ms'])}</td><td>{r['noise']:.2%}</td>"
            f"<td>{r['samples']}</td><td>{r['speedup']:.2f}x</td></tr>"
            for r in self.rows()
        )
        sim = (
            "<div style='color:#b00'>simulated: host times of numba's CUDA simulator, not GPU times</div>"
            if any(m.simulated for m in self.measurements.values())
            else ""
        )
        host = self._host_timed()
        if host:
            sim += f"<div style='color:#b00'>{NO_GPU} for {e(', '.join(host))}: host clock</div>"
        return f"<table><tr>{head}</tr>{body}</table>{sim}"


def compare(*measurements: Measurement | Mapping[str, Measurement] | Iterable[Measurement]) -> Comparison:
    """``compare(naive, mine, reference)`` or ``compare({"naive": a, "mine": b})``: a table with
    speed-ups against the first one."""
    named: dict[str, Measurement] = {}
    for item in measurements:
        if isinstance(item, Measurement):
            items: Iterable[tuple[str, Measurement]] = [(item.name, item)]
        elif isinstance(item, Mapping):
            items = item.items()
        else:
            items = [(m.name, m) for m in item]
        for key, m in items:
            k, i = key, 2
            while k in named:
                k, i = f"{key} ({i})", i + 1
            named[k] = m
    return Comparison(named)
