"""Worker side: the phases of an evaluation, one pool job on one warm worker.

``load`` (compile and import both programs, build the models; outside any region), ``check``
(the correctness trials; outside regions), ``time`` (inside a region per timed case: the
candidate, the device-wide second opinion and the reference, timed the same way). Before each
phase a marker line goes to the job's stdout (:func:`mark`): the client watches each phase's
time limit by them, and interrupts (then kills) the job past it. One job, not one per phase: a
lease would hold a second worker of the GPU for the evaluation's length (the pool keeps one free
for others), and one round trip is the overhead of a warm evaluation.

Each phase gives a :class:`~.outcomes.PhaseResult`: ``verdict`` (None: go on), ``metadata``
(errors by name), ``seconds``, ``output`` (what the candidate printed, head and tail) and
``output_bytes``; the job returns them all as one msgpack-encoded :class:`~.outcomes.PhaseResults`.
Candidate failures are verdicts; a sticky CUDA error is raised on, so that the worker running
this job is recycled (:mod:`krex_lab.workers.context.runner`). Everything of the evaluation is
released (its arrays poisoned) before the job returns, so the worker's reset finds GPU memory
at its baseline.

Every candidate builds in its own directory, ``<cache>/builds/<candidate hash>``: the working
directory and ``TORCH_EXTENSIONS_DIR`` of its phases, so load_inline's build of the same source
is found again (the compile cache) and no two candidates share a build. The reference is
compiled once per worker and problem (a module kept by its hash).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from ..region_report import RegionReport
from .guards import CapturedOutput, memory_limit
from .options import MARKER, Job, Options, ProgramSource
from .outcomes import (
    CheckResult,
    LoadResult,
    PhaseResult,
    PhaseResults,
    ReferenceEntry,
    ReferenceKey,
    ReferenceTime,
    TimedCase,
    TimeResult,
)
from .result import TimingCheck
from .timers import TimingError, agree, cuda_device, stats, time_calls

if TYPE_CHECKING:
    from .gpumode import GpuMode
    from .kernelbench import KernelBench

__all__ = ["mark", "run"]
#: reference modules by source hash: compiled once per problem on this worker
_REFERENCES: dict[str, types.ModuleType] = {}

#: the output limit of the load phase at least: RLIMIT_FSIZE bounds every file a process writes,
#: and nvcc's objects of a large extension exceed the 16 MiB a candidate may print
LOAD_FILE_LIMIT = 1 << 30

_OOM = ("out of memory", "can't allocate memory", "cannot allocate memory", "outofmemory")


@dataclass
class Loaded:
    job: Job
    problem: KernelBench | GpuMode
    build_dir: str
    output_path: str
    device: str
    device_name: str


def _filename(src: ProgramSource, what: str) -> str:
    return src.path or f"<krex-{what}-{src.sha256[:12]}>"


def _module(src: ProgramSource, what: str) -> types.ModuleType:
    """Execute a program as a fresh module (registered in sys.modules, as an import would be:
    dataclasses and pickling look their module up there; the worker's reset forgets it)."""
    name = f"krex_{what}_{src.sha256[:12]}"
    module = types.ModuleType(name)
    module.__file__ = _filename(src, what)
    code = compile(src.text, module.__file__, "exec")
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _device() -> tuple[str, str]:
    """(torch device, what it is: the GPU's model, else the host's CPU)."""
    if cuda_device():
        import torch

        return "cuda", torch.cuda.get_device_name()
    model = "cpu"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = f"cpu: {line.split(':', 1)[1].strip()}"
                break
    return "cpu", model


def trim_compiler_message(text: str, limit: int = 3000) -> str:
    """The compiler's errors out of a build log: lines saying ``error`` and the two after each."""
    lines = text.splitlines()
    keep: list[str] = []
    for i, line in enumerate(lines):
        if "error" in line.lower():
            keep += [ln for ln in lines[i : i + 3] if ln not in keep[-3:]]
    body = "\n".join(keep or lines[-40:])
    return body if len(body) <= limit else body[:limit] + f"\n[... {len(body) - limit} more characters]"


def _classify(exc: BaseException, phase: str, capture: CapturedOutput | None) -> tuple[str, str, str]:
    """(verdict, metadata key, message) for a candidate's exception in ``phase``."""
    from .kernelbench import MissingDefinition

    text = f"{type(exc).__name__}: {exc}"
    low = text.lower()
    if (capture is not None and capture.limited) or (isinstance(exc, OSError) and exc.errno == errno.EFBIG):
        return "rejected", "output_limit", f"the candidate wrote more than its output limit to stdout/stderr ({text})"
    if isinstance(exc, MemoryError) or any(s in low for s in _OOM):
        return "out_of_memory", "out_of_memory", text[:2000]
    if phase == "load" and (
        isinstance(exc, (SyntaxError, ImportError, MissingDefinition)) or "error building extension" in low
    ):
        return "compile_error", "compilation_error", trim_compiler_message(text)
    return "runtime_error", "runtime_error", text[:2000]


def _sticky(exc: BaseException) -> bool:
    from ..workers.context.runner import sticky_cuda_error

    return sticky_cuda_error(exc) is not None


@contextlib.contextmanager
def _guarded(state: Loaded, phase: str, result: PhaseResult) -> Iterator[CapturedOutput]:
    """The candidate's output captured and its memory limited; its failure a verdict in ``result``."""
    limit = state.job.options.output_limit_mb << 20
    if phase == "load":  # the limit is the kernel's per-file one, which the compilers it runs inherit
        limit = max(limit, LOAD_FILE_LIMIT)
    capture = CapturedOutput(state.output_path, limit)
    t0 = time.perf_counter()
    try:
        with capture, memory_limit(state.job.options.memory_limit_mb), _no_grad():
            yield capture
    except Exception as exc:
        if _sticky(exc):
            raise
        result.fail(*_classify(exc, phase, capture))
    except SystemExit as exc:  # the candidate's sys.exit(): a runtime error, never the worker's exit
        result.fail("runtime_error", "runtime_error", f"SystemExit: {exc.code}")
    finally:
        result.seconds = round(time.perf_counter() - t0, 6)
    if capture.limited and result.verdict in (None, "runtime_error", "incorrect"):
        result.fail(
            "rejected",
            "output_limit",
            f"the candidate wrote {capture.bytes} bytes to stdout/stderr: its limit is {capture.limit}",
        )
    result.output = capture.text()
    result.output_bytes = capture.bytes


@contextlib.contextmanager
def _no_grad() -> Iterator[None]:
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    with torch.no_grad():
        yield


def mark(phase: str) -> None:
    """Say on the job's stdout that ``phase`` begins (the client's clock for its limit starts)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os.write(1, f"{MARKER} {phase} {os.getpid()}\n".encode())


def run(job: Job, reference_cache: str | None) -> PhaseResults:
    """Every phase of ``job``, as far as the candidate gets; ``reference_cache``: the directory
    of cached reference times (None: do not use it)."""
    mark("load")
    loaded, state = load(job)
    out = PhaseResults(load=loaded)
    if state is None:
        return out
    try:
        mark("check")
        out.check = check(state)
        if out.check.verdict is None and job.options.measure:
            mark("time")
            out.time = timing(state, reference_cache)
    finally:
        state.problem.close()  # the worker's reset then finds the evaluation's memory freed
    mark("done")
    return out


def load(job: Job) -> tuple[LoadResult, Loaded | None]:
    """Compile and import the reference (once per problem) and the candidate; build the models."""
    build_dir = os.path.join(job.build_root, job.candidate.sha256[:32])
    os.makedirs(build_dir, mode=0o700, exist_ok=True)
    os.chdir(build_dir)
    os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(build_dir, "torch_extensions")
    for d in (job.candidate.path, job.reference.path):  # sibling modules (GPU MODE's task.py, utils.py)
        if d and os.path.dirname(d) not in sys.path:
            sys.path.insert(0, os.path.dirname(d))
    output_path = os.path.join(build_dir, f"output-{job.id}.txt")
    device, device_name = _device()
    result = LoadResult(device=device_name, gpu_timed=device == "cuda")
    reference = _REFERENCES.get(job.reference.sha256)
    if reference is None:
        try:
            reference = _module(job.reference, "reference")
        except Exception as exc:
            result.fail("error", "reference_error", f"the reference does not load: {type(exc).__name__}: {exc}")
            return result, None
        _REFERENCES[job.reference.sha256] = reference
    ref_files = {_filename(job.reference, "reference")}
    try:
        problem = _problem_class(job.format)(job, reference, device, ref_files)
    except Exception as exc:
        if _sticky(exc):
            raise
        result.fail("error", "reference_error", f"the reference fails: {type(exc).__name__}: {exc}")
        return result, None
    state = Loaded(job, problem, build_dir, output_path, device, device_name)
    with _guarded(state, "load", result):
        problem.attach(_module(job.candidate, "candidate"))
    result.compiled = result.verdict is None or "compilation_error" not in result.metadata
    if result.verdict is None:
        return result, state
    problem.close()
    return result, None


def _problem_class(fmt: str) -> type[KernelBench] | type[GpuMode]:
    if fmt == "kernelbench":
        from .kernelbench import KernelBench

        return KernelBench
    from .gpumode import GpuMode

    return GpuMode


def check(state: Loaded) -> CheckResult:
    """The correctness trials."""
    result = CheckResult()
    with _guarded(state, "check", result):
        outcome = state.problem.check()
        meta = result.metadata
        meta["correctness_trials"] = outcome.trials
        if outcome.max_difference is not None:
            meta["max_difference"] = outcome.max_difference
        if outcome.avg_difference is not None:
            meta["avg_difference"] = outcome.avg_difference
        if outcome.issue:
            meta["correctness_issue"] = outcome.issue
        result.cases = outcome.cases
        if outcome.rejected:
            result.verdict = "rejected"
            meta["rejected"] = outcome.rejected
        elif not outcome.correct:
            result.verdict = "incorrect"
    return result


def _reference_key(job: Job, device: str) -> ReferenceKey:
    """What a reference's time depends on: the problem, the GPU model, the method and its settings."""
    o = job.options
    return ReferenceKey(
        reference=job.reference.sha256,
        format=job.format,
        device=device,
        timing=o.timing,
        settings=[o.perf_trials, o.warmup_calls, o.warmup_s, o.min_runs, o.max_runs, o.max_rel_err, o.max_case_s],
        seed=o.seed,
        benchmarks=job.benchmarks,
        mode=o.mode,
        exclusive=o.exclusive,
    )


def timing(state: Loaded, reference_cache: str | None) -> TimeResult:
    """Time the candidate (and the reference, unless its time is cached for this GPU model and
    method) per case, each case inside a region of its own."""
    from . import cache

    opts = state.job.options
    method = "bench" if opts.timing == "bench" else state.job.format
    result = TimeResult()
    key_parts = _reference_key(state.job, state.device_name)
    key = cache.reference_key(key_parts)
    cached = None
    if opts.time_reference and not opts.retime_reference and reference_cache:
        cached = cache.reference_time(key, reference_cache)
    time_reference = opts.time_reference and cached is None
    try:
        with _guarded(state, "time", result):
            for case, cand, ref, per_run in state.problem.targets():
                cand()  # first calls outside the region: JIT compiles, autotuning, allocations
                if time_reference:
                    ref()
                with _region(opts) as region:
                    name, samples = time_calls(cand, method, opts, per_run)
                    _, sync_samples = time_calls(cand, "device-sync", opts) if cuda_device() else (name, [])
                    ref_name, ref_samples = time_calls(ref, method, opts) if time_reference else ("", [])
                part = TimedCase(case=case, method=name, stats=stats(samples), region=region.report)
                part.notice = region.notice
                if sync_samples:
                    sync = stats(sync_samples)
                    part.timing_check = TimingCheck(
                        case=case, method="device-sync", mean=sync.mean, agrees=agree(part.stats.mean, sync.mean)
                    )
                if time_reference:
                    part.reference = ReferenceTime(method=ref_name, stats=stats(ref_samples), region=part.region)
                elif cached is not None:
                    part.reference = cached.parts.get(str(case))
                result.parts.append(part)
    except TimingError as exc:
        result.fail("runtime_error", "runtime_error", str(exc))
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    result.reference_timed_at = cached.timed_at if cached is not None else now
    result.reference_cached = cached is not None
    if time_reference and reference_cache and result.verdict is None and result.parts:
        entry = ReferenceEntry(
            parts={str(p.case): p.reference for p in result.parts},
            timed_at=now,
            device=state.device_name,
            key=key_parts,
        )
        cache.store_reference_time(key, entry, reference_cache)
    return result


class _Region:
    """A timed case's region: its report once released (None: timed without one, ``notice`` says why)."""

    def __init__(self) -> None:
        self.report: RegionReport | None = None
        self.notice: str | None = None


@contextlib.contextmanager
def _region(opts: Options) -> Iterator[_Region]:
    """A region of this worker's GPU for one timed case; without an arbiter (or with
    ``exclusive=False``) none, and the notice says so."""
    holder = _Region()
    if not opts.exclusive:
        holder.notice = "timed without a region (exclusive=False): other work may have shared the GPU"
        yield holder
        return
    from ..client import exclusive

    region = exclusive(max_hold=opts.limit("time"))
    try:
        region.acquire()
    except Exception as exc:
        holder.notice = f"timed without a region ({type(exc).__name__}: {exc})"
        yield holder
        return
    threads = _fit_threads()
    try:
        yield holder
    finally:
        holder.report = region.release()
        if threads is not None:
            sys.modules["torch"].set_num_threads(threads)


def _fit_threads() -> int | None:
    """On the CPU, torch's threads to the cores the region left this process (its shield pins the
    holder to its reserved cores): more threads than cores spin-wait on each other, and a 50 us
    reduction took 50 ms. Returns the number to restore (None: nothing changed)."""
    torch = sys.modules.get("torch")
    if torch is None or cuda_device():
        return None
    before = int(torch.get_num_threads())
    cores = len(os.sched_getaffinity(0))
    if cores >= before:
        return None
    torch.set_num_threads(max(1, cores))
    return before
