"""A reference or a candidate as the caller gave it (a path or the source itself), and its format.

The format is told by the names a file defines at its top level, read with ``ast`` (nothing is
imported or run on the client): KernelBench references define ``Model``, ``get_inputs`` and
``get_init_inputs``, its candidates ``ModelNew``; GPU MODE references define ``generate_input``,
``ref_kernel`` and ``check_implementation``, its submissions ``custom_kernel``.
"""

from __future__ import annotations

import ast
import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .result import FORMATS

__all__ = ["Source", "detect_format", "read_source"]

#: names that mark a file as one format's reference or candidate
REFERENCE_NAMES = {
    "kernelbench": ("Model", "get_inputs", "get_init_inputs"),
    "gpumode": ("generate_input", "ref_kernel", "check_implementation"),
}
CANDIDATE_NAMES = {"kernelbench": ("ModelNew",), "gpumode": ("custom_kernel",)}


@dataclass(frozen=True)
class Source:
    """Source text, where it came from (a path, or None for a string), and its hash."""

    text: str
    path: str | None
    #: what results call it: the path as given, or ``<string>``
    label: str
    sha256: str

    @property
    def directory(self) -> str | None:
        return os.path.dirname(self.path) if self.path else None

    def defined_names(self) -> set[str]:
        return top_level_names(self.text, self.label)


def read_source(value: str | os.PathLike[str], what: str) -> Source:
    """A path to an existing file, or source text (a string with a newline). A path that does not
    exist is a FileNotFoundError naming it."""
    if isinstance(value, str) and "\n" in value:
        digest = hashlib.sha256(value.encode("utf-8", errors="replace")).hexdigest()
        return Source(text=value, path=None, label="<string>", sha256=digest)
    path = Path(value)
    if not path.is_file():
        raise FileNotFoundError(f"the {what} {os.fspath(value)!r} {_why_not_a_file(path)}")
    text = path.read_text(encoding="utf-8", errors="replace")
    digest = hashlib.sha256(text.encode("utf-8", errors="replace")).hexdigest()
    return Source(text=text, path=str(path.resolve()), label=os.fspath(value), sha256=digest)


def _why_not_a_file(path: Path) -> str:
    """What is wrong with a path that names no readable file, as ``ls`` would say it."""
    if path.is_dir():
        return "is a directory, not a file"
    if not path.exists():
        return "does not exist"
    return "is not a regular file"


def _missing(value: Any) -> bool:
    """``value`` names a path (not source text) and nothing is there."""
    if isinstance(value, str) and "\n" in value:
        return False
    return isinstance(value, (str, os.PathLike)) and not os.path.exists(value)


def check_both_there(reference: Any, candidate: Any) -> None:
    """Neither program there: one error naming both (each alone is :func:`read_source`'s error)."""
    if _missing(reference) and _missing(candidate):
        raise FileNotFoundError(
            f"neither the reference {os.fspath(reference)!r} nor the candidate {os.fspath(candidate)!r} exists"
        )


#: one ast.parse at a time in this process: CPython's AST conversion keeps its recursion depth in
#: interpreter-wide state, and parses in two threads at once (a batch's evaluations, each telling
#: its format) can fail with "SystemError: AST constructor recursion depth mismatch"
_PARSE = threading.Lock()


def top_level_names(text: str, label: str = "<string>") -> set[str]:
    """Names bound at module level (functions, classes, assignments, imports)."""
    try:
        with _PARSE:
            tree = ast.parse(text, label)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _fits(fmt: str, ref_names: set[str], cand_names: set[str]) -> bool:
    """The reference defines every name of ``fmt``'s references, the candidate one of its candidates'."""
    return all(n in ref_names for n in REFERENCE_NAMES[fmt]) and any(n in cand_names for n in CANDIDATE_NAMES[fmt])


def detect_format(reference: Source, candidate: Source, format: str = "auto") -> str:
    """``kernelbench`` or ``gpumode``: ``format`` when given, else told by the names each file
    defines. Raises ValueError saying what was found when neither format fits."""
    ref_names, cand_names = reference.defined_names(), candidate.defined_names()
    if format != "auto":
        if format not in FORMATS:
            raise ValueError(f"unknown format {format!r}: one of auto, {', '.join(FORMATS)}")
        other = next((f for f in FORMATS if f != format and _fits(f, ref_names, cand_names)), None)
        if other is not None and not _fits(format, ref_names, cand_names):
            # a pair of the other format: a bad call, said before anything runs (it failed to load)
            raise ValueError(
                f"{reference.label} and {candidate.label} are a {other} pair (they define "
                f"{', '.join(REFERENCE_NAMES[other] + CANDIDATE_NAMES[other])}), not {format} (which needs "
                f"{', '.join(REFERENCE_NAMES[format] + CANDIDATE_NAMES[format])})"
            )
        return format
    for fmt in FORMATS:
        if all(n in ref_names for n in REFERENCE_NAMES[fmt]):
            return fmt
    for fmt in FORMATS:  # a reference missing a name: the candidate may still tell
        if any(n in cand_names for n in CANDIDATE_NAMES[fmt]):
            return fmt
    wanted = "; ".join(
        f"{fmt}: reference {', '.join(REFERENCE_NAMES[fmt])}, candidate {', '.join(CANDIDATE_NAMES[fmt])}"
        for fmt in FORMATS
    )
    raise ValueError(
        f"cannot tell the format of {reference.label} and {candidate.label} from the names they define ({wanted})"
    )
