"""Statistics and the stopping rule of :func:`krex_lab.bench`, on plain sequences of sample times.

Pure Python (no numpy, no GPU): the tests drive it with synthetic sample streams.

The stopping rule is nvbench's ``stdrel`` criterion (its cold measurement):

* at least ``min_samples`` kept samples, and more than ``min_time`` seconds of *measured* time
  (the sum of the kept samples, not wall time), then
* stop when the relative standard deviation of the samples ("noise") is under ``max_noise``, or
* when the noise has settled above that bound: more than 64 noise values recorded, and the
  relative spread of the trailing ones (up to 512, checked every 16 samples) is under 5 % (this
  stops, but is *not* a convergence: the measurement says "not converged (noise X%)");
* in any case stop after ``timeout`` seconds of wall time (not converged) or ``max_samples``.

Discarded samples (taken while the GPU was throttled) never enter the statistics; they are
counted with their reason.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

#: why a measurement stopped; only NOISE is a convergence: STABLE stops (as nvbench does) because
#: more samples would not lower a noise that settled above ``max_noise``, but the criterion was not met
NOISE, STABLE, TIMEOUT, MAX_SAMPLES = "noise", "stable", "timeout", "max_samples"
CONVERGED = (NOISE,)


def noise_met(noise: float, n: int, max_noise: float) -> bool:
    """Whether ``n`` samples of relative stdev ``noise`` meet ``max_noise``: at least two samples (one
    has no noise to speak of) and the noise under the bound, or NaN from a zero mean (all zero)."""
    return n >= 2 and (not math.isfinite(noise) or noise < max_noise)


@dataclass(frozen=True)
class Criterion:
    """When to stop sampling. Defaults are nvbench's (``--min-samples``, ``--min-time``, ``--max-noise``,
    ``--timeout``)."""

    min_samples: int = 10
    #: seconds of measured (kept) sample time before the noise may stop the measurement
    min_time: float = 0.5
    #: relative standard deviation of the samples under which the measurement has converged
    max_noise: float = 0.005
    #: seconds of wall time after which sampling stops, converged or not
    timeout: float = 15.0
    max_samples: int = 100_000
    #: nvbench's settled-noise rule: relative spread of the trailing noise values under this
    stable_spread: float = 0.05
    #: ... once more than this many noise values exist, checked every ``stable_every`` samples
    stable_after: int = 64
    stable_every: int = 16
    #: trailing noise values kept (nvbench's ring buffer)
    noise_window: int = 512

    def __post_init__(self) -> None:
        if self.min_samples < 1 or self.max_samples < self.min_samples:
            raise ValueError(f"need 1 <= min_samples <= max_samples, not {self.min_samples}, {self.max_samples}")
        if self.min_time < 0 or self.timeout <= 0 or self.max_noise < 0:
            raise ValueError("min_time and max_noise must be >= 0 and timeout > 0")

    def to_dict(self) -> CriterionDict:
        return CriterionDict(
            min_samples=self.min_samples,
            min_time=self.min_time,
            max_noise=self.max_noise,
            timeout=self.timeout,
            max_samples=self.max_samples,
            stable_spread=self.stable_spread,
            stable_after=self.stable_after,
            stable_every=self.stable_every,
            noise_window=self.noise_window,
        )


class _CriterionFields(TypedDict):
    min_samples: int
    min_time: float
    max_noise: float
    timeout: float
    max_samples: int
    stable_spread: float
    stable_after: int
    stable_every: int
    noise_window: int


class CriterionDict(_CriterionFields, total=False):
    """A :class:`Criterion` as plain data: a measurement's ``criterion`` (``Measurement.to_dict``,
    result files), with the warm-up seconds :func:`krex_lab.bench` used beside it."""

    warmup: float


@dataclass(frozen=True)
class Summary:
    """Order statistics and moments of a list of sample times (same unit as the samples)."""

    n: int
    median: float
    p5: float
    p95: float
    mean: float
    stdev: float
    rel_stdev: float
    min: float
    max: float


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of already sorted values, interpolated linearly (numpy's default)."""
    if not sorted_values:
        return math.nan
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], not {q}")
    k = (len(sorted_values) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def stdev(values: Sequence[float], center: float | None = None) -> float:
    """Sample standard deviation (n - 1) around ``center`` (the mean by default); NaN below two values."""
    n = len(values)
    if n < 2:
        return math.nan
    c = math.fsum(values) / n if center is None else center
    return math.sqrt(math.fsum((x - c) ** 2 for x in values) / (n - 1))


def summarize(values: Iterable[float]) -> Summary:
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        nan = math.nan
        return Summary(0, nan, nan, nan, nan, nan, nan, nan, nan)
    mean = math.fsum(xs) / n
    sd = stdev(xs, mean)
    return Summary(
        n=n,
        median=percentile(xs, 0.5),
        p5=percentile(xs, 0.05),
        p95=percentile(xs, 0.95),
        mean=mean,
        stdev=sd,
        rel_stdev=sd / mean if mean else math.nan,
        min=xs[0],
        max=xs[-1],
    )


@dataclass
class Convergence:
    """The running state of one measurement: kept samples (ms), discards, the noise history.

    ``add`` one kept sample at a time (like nvbench); ``discard`` throttled ones; ask
    ``stop_reason(elapsed_s)`` after each batch.
    """

    criterion: Criterion = field(default_factory=Criterion)
    samples: list[float] = field(default_factory=list)
    discarded: int = 0
    discard_reasons: collections.Counter[str] = field(default_factory=collections.Counter)

    def __post_init__(self) -> None:
        self._mean = 0.0
        self._m2 = 0.0  # Welford: the sum of squared deviations
        self._total_ms = 0.0
        self._noise: collections.deque[float] = collections.deque(maxlen=self.criterion.noise_window)
        self._since_stable_check = 0

    def add(self, ms: float) -> None:
        if not math.isfinite(ms) or ms < 0:
            raise ValueError(f"a sample time must be a finite number >= 0, not {ms!r}")
        self.samples.append(ms)
        n = len(self.samples)
        delta = ms - self._mean
        self._mean += delta / n
        self._m2 += delta * (ms - self._mean)
        self._total_ms += ms
        self._since_stable_check += 1
        noise = self.noise
        if math.isfinite(noise):
            self._noise.append(noise)

    def extend(self, values: Iterable[float]) -> None:
        for v in values:
            self.add(v)

    def discard(self, count: int, reason: str) -> None:
        if count > 0:
            self.discarded += count
            self.discard_reasons[reason] += count

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def mean(self) -> float:
        return self._mean if self.samples else math.nan

    @property
    def total_s(self) -> float:
        """Measured time of the kept samples, in seconds."""
        return self._total_ms / 1e3

    @property
    def noise(self) -> float:
        """Relative standard deviation of the kept samples (NaN below two samples or a zero mean)."""
        n = len(self.samples)
        if n < 2 or self._mean <= 0:
            return math.nan
        return math.sqrt(max(self._m2, 0.0) / (n - 1)) / self._mean

    def noise_settled(self) -> bool:
        """nvbench: the trailing noise values spread less than ``stable_spread`` around the current one."""
        c = self.criterion
        if len(self._noise) <= c.stable_after or self._since_stable_check < c.stable_every:
            return False
        self._since_stable_check = 0
        current = self._noise[-1]
        if current <= 0:
            return True
        return stdev(list(self._noise), current) / current < c.stable_spread

    def stop_reason(self, elapsed_s: float) -> str | None:
        """Why to stop now (``noise``, ``stable``, ``max_samples``, ``timeout``), or None to go on."""
        c = self.criterion
        if self.n >= c.min_samples and self.total_s > c.min_time:
            if noise_met(self.noise, self.n, c.max_noise):
                return NOISE
            if self.noise_settled():
                return STABLE
        if self.n >= c.max_samples:
            return MAX_SAMPLES
        if elapsed_s > c.timeout:
            return TIMEOUT
        return None

    def shortfalls(self) -> list[str]:
        """What was not reached (for a measurement that timed out), as sentences."""
        c = self.criterion
        out = []
        if self.n < c.min_samples:
            out.append(f"only {self.n} of min_samples={c.min_samples} samples")
        if self.total_s <= c.min_time:
            out.append(f"only {self.total_s:.3g} s of min_time={c.min_time:g} s measured")
        noise = self.noise
        if math.isfinite(noise) and noise >= c.max_noise:
            out.append(f"noise {noise:.2%} above max_noise={c.max_noise:.2%}")
        return out
