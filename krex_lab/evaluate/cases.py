"""GPU MODE's cases, on the client side: ``key: value; key: value`` lines, one case a line.

Tests are checked; benchmarks are checked once, then timed. The judge's side of the format is
:mod:`.judge.problems`; this module imports nothing of it (nor numpy, nor torch).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .task import Case, Task

__all__ = ["MODES", "format_case", "load_cases", "parse_cases"]

MODES = ("test", "benchmark", "leaderboard")

#: one case as a case line gives it: ``generate_input``'s keyword arguments by name
ParsedCase = dict[str, int | float | bool | str]


def _value(text: str) -> int | float | bool | str:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        pass
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def parse_cases(text: str) -> list[ParsedCase]:
    """``size: 1024; seed: 42`` lines -> ``[{"size": 1024, "seed": 42}]`` (``#`` comments and
    blank lines skipped). A part without a colon is a ValueError naming its line."""
    cases: list[ParsedCase] = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        case: ParsedCase = {}
        for part in filter(None, (p.strip() for p in line.split(";"))):
            if ":" not in part:
                raise ValueError(f"case line {n}: {part!r} is not 'key: value'")
            key, value = part.split(":", 1)
            case[key.strip()] = _value(value)
        cases.append(case)
    return cases


def format_case(case: Mapping[str, Any]) -> str:
    return "; ".join(f"{k}: {v}" for k, v in case.items())


def load_cases(
    value: Any, beside: str | None, name: str, task: Task | None = None, mode: str = "benchmark"
) -> list[Case]:
    """Cases from a file, its text, a list of dicts or lines; None: ``<name>.txt`` beside the
    reference, else the problem's ``task.yml`` (``task``: its lists; in a timing mode, ranked by
    ``last``, its last benchmark alone, as GPU MODE's runner runs them), else none (the worker then
    reads the reference's ``TESTS`` / ``BENCHMARKS``). A case is ``generate_input``'s keyword
    arguments: a list's dicts and a ``task.yml``'s pass through as the user wrote them."""
    if value is None:
        txt = Path(beside) / f"{name}.txt" if beside is not None else None
        if txt is not None and txt.is_file():
            return parse_cases(txt.read_text())
        if task is None:
            return []
        return list(task.tests) if name == "tests" else task.timed_benchmarks(mode)
    if isinstance(value, (str, os.PathLike)):
        text = str(value)
        if isinstance(value, os.PathLike) or ("\n" not in text and ":" not in text):
            return parse_cases(Path(value).read_text())
        return parse_cases(text)
    if isinstance(value, Sequence):
        out: list[Case] = []  # the user's keyword arguments: any values
        for item in value:
            out += parse_cases(item) if isinstance(item, str) else [dict(item)]
        return out
    raise TypeError(f"{name}: a file, its text, or a list of dicts or lines, not {type(value).__name__}")
