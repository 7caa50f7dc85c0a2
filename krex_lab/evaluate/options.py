"""What an evaluation is asked to do, as it travels to the worker: :class:`Options` and :class:`Job`.

Defaults follow the formats: KernelBench checks 5 seeded trials and times 100 trials after 3
warm-up calls; GPU MODE warms up 0.2 s, then times until the relative standard error of the mean
is under 1 % (3 to 100 runs, 10 s at most per case). Every phase has its own time limit
(seconds): ``load`` (compile and import both programs, build the models), ``check`` (the
correctness trials), ``time`` (warm-up and timing, the reference's included).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args, get_type_hints

import msgspec
from msgspec import Meta

from .task import Case, TaskInfo

__all__ = [
    "DEFAULT_LIMITS",
    "MARKER",
    "OPTION_DEFAULTS",
    "Case",
    "Cases",
    "EvaluateOptions",
    "Job",
    "Options",
    "Phase",
    "ProgramSource",
]

#: GPU MODE cases as a caller gives them: a file's path, its text, or a list of argument dicts or lines
Cases = str | list[Case | str]
#: an evaluation's phases, each with its own time limit
Phase = Literal["load", "check", "time"]

_Count = Annotated[int, Meta(ge=1)]
_Whole = Annotated[int, Meta(ge=0)]
_Seconds = Annotated[float, Meta(gt=0)]
_Tolerance = Annotated[float, Meta(ge=0)]


class EvaluateOptions(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """An evaluation's options as a caller gives them, one name each: the keywords of
    :func:`krex_lab.evaluate`, ``krex eval``'s flags, a batch manifest's lines and the MCP tools'
    arguments all become this, checked once (:meth:`of`). None: the default (the format's, or a
    published task's). See :func:`krex_lab.evaluate` for what each does."""

    format: Literal["auto", "kernelbench", "gpumode"] = "auto"
    gpu: _Whole | None = None
    timing: Literal["format", "bench", "converge"] = "format"
    measure: bool = True
    trials: _Count | None = None
    perf_trials: _Count | None = None
    mode: Literal["test", "benchmark", "leaderboard"] = "benchmark"
    tests: Cases | None = None
    benchmarks: Cases | None = None
    atol: _Tolerance | None = None
    rtol: _Tolerance | None = None
    seed: _Whole | None = None
    strict: bool = False
    max_case_s: _Seconds | None = None
    retime_reference: bool = False
    time_reference: bool = True
    #: seconds per phase (a phase left out: a published task's limit for the mode, else :data:`DEFAULT_LIMITS`)
    timeouts: dict[Phase, _Seconds] | None = None
    memory_limit_mb: _Whole | None = None
    output_limit_mb: _Count | None = None
    disk_limit_mb: _Whole | None = None
    exclusive: bool = True
    memory_budget_mb: _Whole | None = None

    @classmethod
    def of(cls, given: Mapping[str, Any]) -> EvaluateOptions:
        """``given`` (option name -> value) checked, every option by its type and range: a bad one
        is a ValueError naming it and saying what it takes. A path (``os.PathLike``) of cases is
        taken as its string."""
        data = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in given.items()}
        try:
            return msgspec.convert(data, cls)
        except msgspec.ValidationError as exc:
            raise ValueError(_said(exc, set(data))) from None

    def given(self) -> dict[str, Any]:
        """The options set to other than their default (what a batch line's own options replace)."""
        return {f: v for f in self.__struct_fields__ if (v := getattr(self, f)) != OPTION_DEFAULTS[f]}

    def merged(self, over: Mapping[str, Any]) -> EvaluateOptions:
        """These options with ``over``'s in their place, checked again."""
        return EvaluateOptions.of({**self.given(), **over})


def _said(exc: msgspec.ValidationError, names: set[str]) -> str:
    """msgspec's message said with the option's name (``unknown timing 'fast': one of format, ...``,
    ``seed must be `int` >= 0``)."""
    text = str(exc)
    if text.startswith("Object contains unknown field"):
        return f"unknown option {text.rpartition(' ')[2]} (the options: {', '.join(EvaluateOptions.__struct_fields__)})"
    what, _, where = text.partition(" - at ")
    where = where.strip("`")
    if where.startswith("key` in `$."):  # a mapping's key: the phases of ``timeouts``
        name = where.removeprefix("key` in `$.")
        return f"unknown phase {what.removeprefix('Invalid enum value ')} in {name}: {', '.join(get_args(Phase))}"
    name = where.removeprefix("$.")
    if what.startswith("Invalid enum value ") and name in names:
        choices = get_args(get_type_hints(EvaluateOptions)[name])
        return f"unknown {name} {what.removeprefix('Invalid enum value ')}: one of {', '.join(choices)}"
    return f"{name} must be {what.removeprefix('Expected ')}"


#: each option's default, by name
OPTION_DEFAULTS: dict[str, object] = {f: getattr(EvaluateOptions(), f) for f in EvaluateOptions.__struct_fields__}


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
    timeouts: dict[str, float] = {}
    #: host memory the candidate may add while it runs (MiB; 0: no limit)
    memory_limit_mb: int = 16384
    #: bytes the candidate may write to stdout and stderr per phase (MiB); more fails the write
    output_limit_mb: int = 16
    #: disk the candidate may use (MiB; 0: not watched): its build directory and the removed
    #: files it holds open; more, and it is killed (``disk_limit``)
    disk_limit_mb: int = 4096
    #: time inside a region (False: share the GPU, and the result says so)
    exclusive: bool = True
    #: GPU memory the input sets of a case may take (MiB; 0: the judge's default, 512): a batch
    #: sets it from the memory free when it admitted the evaluation
    memory_budget_mb: int = 0

    def limit(self, phase: str) -> float:
        return float(self.timeouts.get(phase, DEFAULT_LIMITS[phase]))


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
    tests: list[Case] = []
    benchmarks: list[Case] = []
    #: a published GPU MODE problem's files (name -> text), as its task.yml lays them out beside
    #: the submission (the submission's own text under its name): the worker writes them into a
    #: private directory first on ``sys.path`` (:func:`krex_lab.evaluate.task.lay_out`,
    #: :func:`~krex_lab.evaluate.task.layout_on_path`). Empty: a lone reference file.
    files: dict[str, str] = {}
    #: the task those files come from (None: no task.yml)
    task: TaskInfo | None = None
