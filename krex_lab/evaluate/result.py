"""What an evaluation gives back: :class:`Evaluation`, one per (reference, candidate) pair.

Plain msgspec structs, so that a result is JSON as it stands (``Evaluation.to_json()``, one line
of ``krex eval --json`` or of a batch's output) and reads back with ``Evaluation.from_json``.
Every time is in microseconds. The KernelBench fields keep KernelBench's names and meanings
(``runtime`` -1 when nothing was timed); the GPU MODE fields are per case, as GPU MODE reports
them (runs, mean, std, err, best, worst).

The region report of each timed part is the arbiter's typed :class:`~krex_lab.RegionReport`;
it travels from the worker typed (:mod:`.outcomes`).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ..region_report import RegionReport

__all__ = [
    "FORMATS",
    "METHODS",
    "VERDICTS",
    "CaseResult",
    "Evaluation",
    "Packages",
    "Reproducibility",
    "TimedPart",
    "TimingCheck",
    "TimingChecks",
    "TimingStats",
]

Format = Literal["kernelbench", "gpumode"]
FORMATS: tuple[str, ...] = ("kernelbench", "gpumode")

#: ``format``: the problem format's own timing method (KernelBench: an event pair around each of
#: 100 forwards after a warm-up; GPU MODE: 0.2 s warm-up, then runs until the relative standard
#: error of the mean is under 1 %, 3 to 100 runs); ``bench``: :func:`krex_lab.bench`'s;
#: ``converge``: GPU MODE's method run until the relative standard error of the mean is at most
#: 0.1 %, however many runs that takes, or ``max_case_s`` (the stats say whether it converged)
Method = Literal["format", "bench", "converge"]
METHODS: tuple[str, ...] = ("format", "bench", "converge")

#: every verdict, worst news last. ``correct``: compiled, ran and matched the reference on every
#: trial. ``incorrect``: ran, but its output differs (or its checker said no). ``compile_error``:
#: the candidate did not compile or load. ``runtime_error``: it raised. ``crashed``: its worker
#: died (segfault, abort, sticky CUDA error). ``timeout``: a phase ran past its limit.
#: ``out_of_memory``: it exhausted host or device memory. ``rejected``: it did something an honest
#: kernel does not (wrote into its inputs, returned an input as its output, called the
#: reference, flooded its output, left work running). ``error``: the evaluation itself could
#: not run (bad reference, no pool); nothing is said about the candidate.
VERDICTS: tuple[str, ...] = (
    "correct",
    "incorrect",
    "compile_error",
    "runtime_error",
    "crashed",
    "timeout",
    "out_of_memory",
    "rejected",
    "error",
)


class TimingStats(msgspec.Struct, kw_only=True):
    """KernelBench's ``runtime_stats``: microseconds over ``num_trials`` timed calls."""

    mean: float
    std: float
    min: float
    max: float
    num_trials: int
    #: ``timing="converge"``: whether the relative standard error of the mean reached its target
    #: before the time cap (None: a method with a fixed number of calls)
    converged: bool | None = None


class CaseResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One GPU MODE case (a test or a benchmark), its arguments as the case line gave them.

    ``passed``: the reference's ``check_implementation`` on the candidate's output (None: not
    checked). Times (microseconds) are the candidate's; ``ref_mean`` is the reference's mean
    timed the same way, where it was timed."""

    spec: str
    kind: Literal["test", "benchmark"] = "test"
    passed: bool | None = None
    message: str | None = None
    runs: int = 0
    mean: float | None = None
    std: float | None = None
    err: float | None = None
    best: float | None = None
    worst: float | None = None
    ref_mean: float | None = None
    #: ``timing="converge"``: whether this case's mean converged before the time cap
    converged: bool | None = None


class TimingCheck(msgspec.Struct, kw_only=True):
    """The device-wide second opinion on one timed case: its mean (µs) and whether it agrees
    with the method's own figure (made on the worker, listed in :class:`TimingChecks`)."""

    case: str | None
    method: str
    mean: float
    agrees: bool


class TimingChecks(msgspec.Struct, kw_only=True):
    """:attr:`Evaluation.timing_check`: every timed case's second opinion, by ``method``."""

    method: str
    cases: list[TimingCheck]


class TimedPart(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One timed part of an evaluation and the region it was timed in.

    ``program``: ``candidate`` or ``reference``; ``case``: the GPU MODE case (None for
    KernelBench); ``method``: what timed it (``kernelbench-events``, ``gpumode-events``,
    ``bench``, ``host-clock``, ``device-sync``); ``region``: the region's report (None: timed
    without a region, and ``notice`` says why); ``cached``: a reference time
    taken from the cache (``timed_at`` says when it was measured)."""

    program: Literal["candidate", "reference"]
    method: str
    case: str | None = None
    region: RegionReport | None = None
    cached: bool = False
    timed_at: str | None = None
    notice: str | None = None


class Packages(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Versions of what produced a result (None: not installed where the judge ran)."""

    python: str
    krex_lab: str | None = None
    torch: str | None = None
    triton: str | None = None
    numpy: str | None = None
    #: torch's CUDA (or ROCm) build, where torch is imported
    torch_cuda: str | None = None


class Reproducibility(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What it takes to run an evaluation again and compare: made by the judge
    (:func:`krex_lab.evaluate.judge.record.collect`) as the evaluation starts.

    ``seed``: the seed the caller gave (``seed_given``), from which every input set's seed is
    derived; without one each set's seed is drawn alone from the CSPRNG, and ``seeds`` lists them
    all (said once the candidate's process is gone); ``init_seed``: KernelBench's public seed
    before both models are built.
    ``sources``: sha256 of the reference, the candidate and every laid-out file (``files``).
    ``timing``: the method asked for and every setting it ran under; ``tolerances``: atol and rtol
    as given (None: by the output's precision); ``numerics``: the floating-point switches both sides
    were given (:mod:`krex_lab.evaluate.numerics`; empty: torch's defaults). ``clocks_mhz``: the
    GPU's SM and memory clocks as the evaluation started, where NVML gives them."""

    packages: Packages
    device: str
    gpu_name: str | None = None
    gpu_uuid: str | None = None
    driver: str | None = None
    clocks_mhz: dict[str, int] = {}
    seed: int | None = None
    seed_given: bool = False
    #: every input set's seed, in the order drawn (each from the CSPRNG unless ``seed`` was given)
    seeds: list[int] = []
    init_seed: int | None = None
    reference_sha256: str
    candidate_sha256: str
    files: dict[str, str] = {}
    task: str | None = None
    timing: dict[str, str | float | int | bool] = {}
    tolerances: dict[str, float | None] = {}
    numerics: dict[str, str | bool] = {}
    hostname: str | None = None


class Evaluation(msgspec.Struct, kw_only=True):
    """The verdict on one candidate against its reference (see ``docs/evaluate.md``).

    KernelBench-compatible: ``compiled``, ``correctness``, ``metadata`` (errors by name:
    ``compilation_error``, ``runtime_error``, ``correctness_issue``, ``timeout``,
    ``worker_died``, ``rejected``, ...), ``runtime`` / ``ref_runtime`` (mean, µs; -1 when not
    timed), ``runtime_stats`` / ``ref_runtime_stats``, ``speedup`` (``ref_runtime / runtime``).
    For GPU MODE problems ``runtime`` and ``ref_runtime`` are the geometric means of the
    benchmark cases' means, and ``tests`` / ``benchmarks`` hold every case."""

    format: str
    verdict: str
    summary: str
    reference: str
    candidate: str
    compiled: bool = False
    correctness: bool = False
    metadata: dict[str, Any] = {}
    runtime: float = -1.0
    runtime_stats: TimingStats | None = None
    ref_runtime: float = -1.0
    ref_runtime_stats: TimingStats | None = None
    speedup: float | None = None
    #: GPU MODE cases
    tests: list[CaseResult] = []
    benchmarks: list[CaseResult] = []
    #: the timing method asked for (``format`` or ``bench``) and what it was in fact
    timing: str = "format"
    timing_method: str | None = None
    #: False: times are host-clock times (no GPU was timed: the CPU or the fake backend)
    gpu_timed: bool = False
    device: str | None = None
    gpu: int | None = None
    simulated: bool = False
    #: every timed part, each with its region report
    regions: list[TimedPart] = []
    #: a second opinion on the candidate's time (a device-wide synchronisation around each call),
    #: and whether it disagrees with the method's own figure
    timing_check: TimingChecks | None = None
    #: wall seconds of each phase as the worker measured it (load, check, time), and in all
    phases: dict[str, float] = {}
    wall_s: float = 0.0
    reference_hash: str | None = None
    candidate_hash: str | None = None
    worker_pid: int | None = None
    warnings: list[str] = []
    #: what the judge noticed beside the verdict, by name: the static pre-check's rules
    #: (``static:<rule>``), ``timing_bound`` (an in-process time below the judge's bound),
    #: ``correctness_rule:<rule>`` (a constant, zero or NaN output), ``processes_left``
    flags: list[str] = []
    #: what the candidate wrote to stdout/stderr (head and tail; ``metadata["output_bytes"]`` counts it all)
    output: str | None = None
    #: versions, GPU, driver, clocks, seeds, source hashes, timing settings, tolerances
    reproducibility: Reproducibility | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out

    def to_json(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def from_json(cls, data: str | bytes) -> Evaluation:
        return msgspec.json.decode(data, type=cls)

    def region_reports(self) -> list[RegionReport]:
        """The region report of every timed part."""
        return [p.region for p in self.regions if p.region is not None]

    def __str__(self) -> str:
        return self.summary
