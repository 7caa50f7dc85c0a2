"""What an evaluation is asked to do, as it travels to the worker: :class:`Options` and :class:`Job`.

Defaults follow the formats: KernelBench checks 5 seeded trials and times 100 trials after 3
warm-up calls; GPU MODE warms up 0.2 s, then times until the relative standard error of the mean
is under 1 % (3 to 100 runs, 10 s at most per case). Every phase has its own time limit
(seconds): ``load`` (compile and import both programs, build the models), ``check`` (the
correctness trials), ``time`` (warm-up and timing, the reference's included).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import msgspec

from .task import TaskInfo

__all__ = ["DEFAULT_LIMITS", "MARKER", "Cases", "EvaluateArgs", "Job", "Options", "ProgramSource"]

#: GPU MODE cases as a caller gives them: a file, its text, or a list of argument dicts or lines
Cases = str | os.PathLike[str] | Sequence[Mapping[str, Any] | str]


class EvaluateArgs(TypedDict, total=False):
    """The keyword options of :func:`krex_lab.evaluate` that ``krex eval`` and a batch
    manifest's lines set (:mod:`.cli` makes them, :mod:`.batch` merges a line's over them)."""

    format: str
    gpu: int | None
    timing: str
    measure: bool
    trials: int | None
    perf_trials: int | None
    mode: str
    tests: Cases | None
    benchmarks: Cases | None
    atol: float | None
    rtol: float | None
    seed: int | None
    strict: bool
    max_case_s: float | None
    retime_reference: bool
    time_reference: bool
    exclusive: bool
    timeouts: Mapping[str, float] | None
    memory_budget_mb: int | None


#: the start of a phase marker line on the job's stdout: ``<MARKER> <phase> <judge pid> <nonce> [candidate pid]``
MARKER = "@krex-evaluate-phase@"

#: seconds per phase: compiling CUDA with load_inline takes a minute or more
DEFAULT_LIMITS: dict[str, float] = {"load": 600.0, "check": 300.0, "time": 300.0}


class Options(msgspec.Struct, kw_only=True, frozen=True):
    """Every knob of one evaluation (see :func:`krex_lab.evaluate`)."""

    #: ``format``, ``bench`` or ``converge`` (see :data:`krex_lab.evaluate.result.METHODS`)
    timing: str = "format"
    #: time at all (False: compile and check only)
    measure: bool = True
    #: correctness trials (KernelBench's default 5; GPU MODE checks each test case once)
    trials: int = 5
    #: timed calls (KernelBench's 100) and warm-up calls (3) of the KernelBench method
    perf_trials: int = 100
    warmup_calls: int = 3
    #: GPU MODE's method: warm-up seconds, runs, relative standard error, seconds per case
    warmup_s: float = 0.2
    min_runs: int = 3
    max_runs: int = 100
    max_rel_err: float = 0.01
    max_case_s: float = 10.0
    #: ``timing="converge"``: GPU MODE's method run until the relative standard error of the mean
    #: is at most this (0.1 %), with no cap on runs: ``max_case_s`` bounds each case instead
    converge_rel_err: float = 0.001
    #: GPU MODE's modes: ``test`` (check only), ``benchmark``, ``leaderboard`` (check every timed run)
    mode: str = "benchmark"
    #: tolerances; None: by the output's precision (fp32 1e-4, fp16/bf16 1e-2, fp64 1e-7)
    atol: float | None = None
    rtol: float | None = None
    #: the inputs' seed: None draws a secret one (said in the result afterwards); a number makes a
    #: run reproducible. The candidate never sees it.
    seed: int | None = None
    #: KernelBench's seed before both models are built (public: the parameters must match)
    init_seed: int = 42
    #: re-check every timed call's output (default: two drawn at random per round)
    strict: bool = False
    #: time the reference again even when the cache has its time
    retime_reference: bool = False
    #: time the reference at all (False: no speedup)
    time_reference: bool = True
    #: seconds per phase (missing phases: :data:`DEFAULT_LIMITS`)
    limits: dict[str, float] = {}
    #: host memory the candidate may add while it runs (MiB; 0: no limit)
    memory_limit_mb: int = 16384
    #: bytes the candidate may write to stdout and stderr per phase (MiB); more fails the write
    output_limit_mb: int = 16
    #: time inside a region (False: share the GPU, and the result says so)
    exclusive: bool = True
    #: GPU memory the input sets of a case may take (MiB; 0: the judge's default, 512): a batch
    #: sets it from the memory free when it admitted the evaluation
    memory_budget_mb: int = 0

    def limit(self, phase: str) -> float:
        return float(self.limits.get(phase, DEFAULT_LIMITS[phase]))


class ProgramSource(msgspec.Struct, kw_only=True, frozen=True):
    """A program's source as the worker gets it (it reads no file of the caller's)."""

    text: str
    path: str | None
    label: str
    sha256: str


class Job(msgspec.Struct, kw_only=True):
    """One evaluation as its worker sees it."""

    id: str
    #: what the judge's phase markers carry: the candidate never sees it, so no line it prints is one
    nonce: str = ""
    format: str
    reference: ProgramSource
    candidate: ProgramSource
    options: Options
    #: where builds go: ``<cache>/builds/<candidate hash>``
    build_root: str
    #: GPU MODE cases: the keyword arguments of the reference's ``generate_input``, as the user
    #: wrote them (any values the user's function takes)
    tests: list[dict[str, Any]] = []
    benchmarks: list[dict[str, Any]] = []
    #: a published GPU MODE problem's files (name -> text), as its task.yml lays them out beside
    #: the submission (the submission's own text under its name): the worker writes them into a
    #: private directory first on ``sys.path`` (:func:`krex_lab.evaluate.task.lay_out`,
    #: :func:`~krex_lab.evaluate.task.layout_on_path`). Empty: a lone reference file.
    files: dict[str, str] = {}
    #: the task those files come from (None: no task.yml)
    task: TaskInfo | None = None
