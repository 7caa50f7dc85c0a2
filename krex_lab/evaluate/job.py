"""Client side: a call of :func:`krex_lab.evaluate` made into a :class:`~.options.Job`, every option
checked before any worker is asked anything.

The reference is a file, source text, or a published GPU MODE problem: its directory, or a file
beside its ``task.yml`` (:mod:`.task`). A task gives the job its laid-out files (the submission's
among them), its cases and, for the phases the caller gave no limit, its time limit for the mode.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path
from typing import Any

import msgspec

from . import cache
from .options import EvaluateOptions, Job, Options, ProgramSource
from .source import Source, check_both_there, detect_format, read_source
from .task import Task, find_task, read_task

__all__ = ["PHASES", "build_job"]

PHASES = ("load", "check", "time")
#: the options the judge reads (the rest are the client's: the format, the GPU, the cases, the limits)
_JUDGED = tuple(
    f for f in EvaluateOptions.__struct_fields__ if f not in ("format", "gpu", "tests", "benchmarks", "timeouts")
)


def _program(src: Source) -> ProgramSource:
    return ProgramSource(text=src.text, path=src.path, label=src.label, sha256=src.sha256)


def _task_of(reference: Any, candidate: Source) -> tuple[Task | None, bool]:
    """The published problem ``reference`` names, if any, and whether it named its directory."""
    if not isinstance(reference, (str, os.PathLike)) or (isinstance(reference, str) and "\n" in reference):
        return None, False
    path = Path(reference)
    if path.is_dir():
        yml = find_task(path)
        if yml is None:
            raise FileNotFoundError(f"the reference {os.fspath(reference)!r} is a directory without a task.yml")
        return read_task(yml, candidate.text), True
    yml = find_task(path) if path.is_file() else None
    if yml is None:
        return None, False
    if path.name in ("task.yml", "task.yaml"):  # the task itself: its reference.py
        return read_task(yml, candidate.text), True
    return read_task(yml, candidate.text, reference=str(path)), False


def build_job(reference: Any, candidate: Any, options: EvaluateOptions | None = None, **given: object) -> Job:
    """Read both programs (and the reference's task.yml, where it has one), tell their format:
    a bad call raises here (ValueError, FileNotFoundError), before any worker is asked anything.
    ``options``: checked already; else ``given``, by option name, checked here
    (:meth:`EvaluateOptions.of`)."""
    from .cases import load_cases

    opts = options if options is not None else EvaluateOptions.of(given)
    timeouts: dict[str, float] = {str(phase): s for phase, s in (opts.timeouts or {}).items()}
    check_both_there(reference, candidate)
    cand = read_source(candidate, "candidate")
    task, named_task = _task_of(reference, cand)
    if task is not None:
        assert task.reference_path is not None
        label = os.fspath(reference)
        if named_task:
            label = os.path.join(label if Path(label).is_dir() else os.path.dirname(label), task.info.reference)
        ref = Source(
            text=task.reference_text,
            path=task.reference_path,
            label=label,
            sha256=hashlib.sha256(task.reference_text.encode("utf-8", errors="replace")).hexdigest(),
        )
    else:
        ref = read_source(reference, "reference")
    fmt = detect_format(ref, cand, opts.format)
    if task is not None and fmt != "gpumode":
        if named_task:
            raise ValueError(f"{task.info.path} is a GPU MODE task, but the format asked for is {fmt!r}")
        task = None  # a task.yml beside another format's reference is none of its business
    mode = opts.mode
    if task is not None:
        for phase in PHASES:
            timeouts.setdefault(phase, task.timeout(mode))
    judged = {f: v for f in _JUDGED if (v := getattr(opts, f)) is not None}  # None: the judge's default
    options_ = msgspec.convert({**judged, "timeouts": timeouts}, Options)
    tests, benchmarks = opts.tests, opts.benchmarks
    gm = fmt == "gpumode"
    return Job(
        id=secrets.token_hex(8),
        nonce=secrets.token_hex(16),
        format=fmt,
        reference=_program(ref),
        candidate=_program(cand),
        options=options_,
        build_root=str(cache.builds_dir()),
        tests=load_cases(tests, ref.directory, "tests", task, mode) if gm else [],
        benchmarks=load_cases(benchmarks, ref.directory, "benchmarks", task, mode) if gm else [],
        files=dict(task.files) if task is not None else {},
        task=task.info if task is not None else None,
    )
