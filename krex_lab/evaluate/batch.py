"""Many evaluations at once: a manifest of (reference, candidate) pairs in, JSON lines out.

Manifest, one pair a line (``#`` comments and blank lines skipped), either form on any line:

* ``REFERENCE CANDIDATE [ID]`` (whitespace-separated paths; no spaces in them);
* a JSON object: ``{"reference": ..., "candidate": ..., "id": ..., "format": ..., "gpu": ...,
  "timing": ..., "mode": ..., "tests": ..., "benchmarks": ...}`` (only the first two required).

Relative paths are relative to the manifest's directory. Output: exactly one JSON line per pair,
as each finishes: the :class:`~krex_lab.evaluate.result.Evaluation` plus ``index`` (the pair's
place in the manifest, from 0) and ``id`` (as given, else the candidate's path). A line that
cannot be read, a missing file or any failure of the evaluation itself is that pair's result,
with verdict ``error`` and the reason in ``metadata``.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import msgspec
from msgspec import UNSET, UnsetType

from .options import EvaluateOptions
from .pairs import PAIR_OPTIONS, BatchRecord, Pair, Progress, error_result
from .task import Case

if TYPE_CHECKING:
    from ..workers.client import PoolClient
    from .admission import MemoryPolicy

__all__ = ["PAIR_OPTIONS", "BatchRecord", "Pair", "Progress", "error_result", "parse_manifest", "run_batch"]

#: GPU MODE cases on a manifest line: their text, or a list of lines or argument objects
_ManifestCases = str | list[str | Case]


class ManifestLine(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A manifest's JSON line (see the module doc): the pair and the options it sets."""

    reference: str
    candidate: str
    id: str | int | None = None
    format: str | UnsetType = UNSET
    gpu: int | UnsetType | None = UNSET
    timing: str | UnsetType = UNSET
    mode: str | UnsetType = UNSET
    tests: _ManifestCases | UnsetType | None = UNSET
    benchmarks: _ManifestCases | UnsetType | None = UNSET
    trials: int | UnsetType | None = UNSET
    perf_trials: int | UnsetType | None = UNSET
    measure: bool | UnsetType = UNSET
    seed: int | UnsetType | None = UNSET
    strict: bool | UnsetType = UNSET
    atol: float | UnsetType | None = UNSET
    rtol: float | UnsetType | None = UNSET
    max_case_s: float | UnsetType | None = UNSET

    def options(self) -> dict[str, object]:
        """The options the line sets (checked by type on decoding, by range here: ValueError)."""
        given = {k: v for k in PAIR_OPTIONS if (v := getattr(self, k)) is not UNSET}
        EvaluateOptions.of(given)
        return given


def _resolve(path: str, base: Path) -> str:
    p = Path(os.path.expanduser(path))
    return str(p if p.is_absolute() else base / p)


def parse_manifest(text: str, base: str | os.PathLike[str] = ".") -> list[Pair]:
    """Every pair of a manifest (see the module doc); unreadable lines are pairs with a ``problem``."""
    root = Path(base)
    pairs: list[Pair] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pair = Pair(index=len(pairs), line=n)
        pairs.append(pair)
        if line.startswith("{"):
            try:
                item = msgspec.json.decode(line, type=ManifestLine)
            except msgspec.DecodeError as exc:
                pair.problem = f"manifest line {n}: not a JSON object with reference and candidate and options ({exc})"
                continue
            pair.reference, pair.candidate = item.reference, item.candidate
            pair.id = None if item.id is None else str(item.id)
            try:
                pair.options = item.options()
            except ValueError as exc:
                pair.problem = f"manifest line {n}: {exc}"
        else:
            fields = line.split()
            if len(fields) not in (2, 3):
                pair.problem = f"manifest line {n}: expected 'REFERENCE CANDIDATE [ID]', got {len(fields)} field(s)"
                continue
            pair.reference, pair.candidate = fields[0], fields[1]
            pair.id = fields[2] if len(fields) == 3 else None
        pair.reference, pair.candidate = _resolve(pair.reference, root), _resolve(pair.candidate, root)
    return pairs


def run_batch(
    pairs: Sequence[Pair],
    *,
    jobs: int,
    defaults: EvaluateOptions,
    pool: PoolClient | None,
    emit: Callable[[BatchRecord], None],
    progress: TextIO | None = None,
    memory: MemoryPolicy | None = None,
) -> Counter[str]:
    """Evaluate ``pairs``, ``jobs`` at once over every GPU the pool serves, admitted by GPU memory
    (:mod:`.many`, :mod:`.admission`); ``emit`` each result as it finishes, exactly once per pair.
    Returns the count of each verdict."""
    from .many import run_pairs

    return run_pairs(pairs, jobs=jobs, defaults=defaults, pool=pool, emit=emit, progress=progress, memory=memory)
