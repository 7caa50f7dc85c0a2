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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import cache
from .options import Job, Options, ProgramSource
from .result import METHODS
from .source import Source, check_both_there, detect_format, read_source
from .task import Task, find_task, read_task

__all__ = ["PHASES", "build_job", "check_options"]

PHASES = ("load", "check", "time")


def _program(src: Source) -> ProgramSource:
    return ProgramSource(text=src.text, path=src.path, label=src.label, sha256=src.sha256)


def _number(name: str, value: Any, *, low: float, strict: bool) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or (value <= low if strict else value < low):
        bound = f"> {low:g}" if strict else f">= {low:g}"
        raise ValueError(f"{name} must be a number {bound}, not {value!r}")


def check_options(kw: Mapping[str, Any]) -> dict[str, float]:
    """Every option's type and range (None: the default); returns the phase limits given.
    A bad option is a ValueError naming it and saying what it takes."""
    from .cases import MODES

    if kw.get("timing", "format") not in METHODS:
        raise ValueError(f"unknown timing {kw['timing']!r}: one of {', '.join(METHODS)}")
    if kw.get("mode", "benchmark") not in MODES:
        raise ValueError(f"unknown mode {kw['mode']!r}: one of {', '.join(MODES)}")
    for name in ("trials", "perf_trials"):
        value = kw.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} must be a whole number >= 1, not {value!r}")
    for name in ("atol", "rtol"):
        if kw.get(name) is not None:
            _number(name, kw[name], low=0.0, strict=False)
    if kw.get("max_case_s") is not None:
        _number("max_case_s", kw["max_case_s"], low=0.0, strict=True)
    seed = kw.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise ValueError(f"seed must be a whole number >= 0 (or None: a secret one), not {seed!r}")
    for name in ("strict", "measure", "exclusive", "retime_reference", "time_reference"):
        if name in kw and not isinstance(kw[name], bool):
            raise ValueError(f"{name} must be True or False, not {kw[name]!r}")
    budget = kw.get("memory_budget_mb")
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 0):
        raise ValueError(f"memory_budget_mb must be a whole number of MiB >= 0, not {budget!r}")
    limits = dict(kw.get("timeouts") or {})
    for phase, seconds in limits.items():
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r} in timeouts: {', '.join(PHASES)}")
        _number(f"timeouts[{phase!r}]", seconds, low=0.0, strict=True)
    return {p: float(s) for p, s in limits.items()}


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


def build_job(reference: Any, candidate: Any, **kw: Any) -> Job:
    """Read both programs (and the reference's task.yml, where it has one), tell their format,
    check every option: a bad call raises here (ValueError, FileNotFoundError), before any worker
    is asked anything."""
    from .cases import load_cases

    limits = check_options(kw)
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
    fmt = detect_format(ref, cand, kw.pop("format", "auto"))
    if task is not None and fmt != "gpumode":
        if named_task:
            raise ValueError(f"{task.info.path} is a GPU MODE task, but the format asked for is {fmt!r}")
        task = None  # a task.yml beside another format's reference is none of its business
    mode = kw.get("mode", "benchmark")
    if task is not None:
        for phase in PHASES:
            limits.setdefault(phase, task.timeout(mode))
    tests, benchmarks = kw.pop("tests", None), kw.pop("benchmarks", None)
    kw.pop("timeouts", None)
    fields = {k: v for k, v in kw.items() if v is not None}
    options = Options(limits=limits, **fields)
    gm = fmt == "gpumode"
    return Job(
        id=secrets.token_hex(8),
        nonce=secrets.token_hex(16),
        format=fmt,
        reference=_program(ref),
        candidate=_program(cand),
        options=options,
        build_root=str(cache.builds_dir()),
        tests=load_cases(tests, ref.directory, "tests", task, mode) if gm else [],
        benchmarks=load_cases(benchmarks, ref.directory, "benchmarks", task, mode) if gm else [],
        files=dict(task.files) if task is not None else {},
        task=task.info if task is not None else None,
    )
