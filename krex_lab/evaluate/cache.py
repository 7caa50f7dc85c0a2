"""Where evaluations keep things between calls: build directories and reference times.

``$KREX_EVAL_CACHE`` (default ``$XDG_CACHE_HOME/krex/evaluate``, else ``~/.cache/krex/evaluate``):

* ``builds/<candidate hash>/``: each candidate's build directory (its ``TORCH_EXTENSIONS_DIR``
  and working directory), so the same source is not compiled twice;
* ``reference-times/<key>.json``: a reference's time per (problem, GPU model, method and its
  settings), with the date it was measured, written atomically (a batch's evaluations share it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["builds_dir", "cache_dir", "reference_key", "reference_time", "store_reference_time"]


def cache_dir() -> Path:
    root = os.environ.get("KREX_EVAL_CACHE")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "krex" / "evaluate"


def builds_dir() -> Path:
    path = cache_dir() / "builds"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def reference_key(parts: dict[str, Any]) -> str:
    """A file name for the reference time of everything in ``parts`` (hash, device, method, ...)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:40]


def _path(key: str, root: str | os.PathLike[str]) -> Path:
    return Path(root) / "reference-times" / f"{key}.json"


def reference_time(key: str, root: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The cached entry under cache directory ``root`` (``parts``: per case, ``timed_at``,
    ``device``, ``key``) or None."""
    try:
        data: dict[str, Any] = json.loads(_path(key, root).read_text())
        return data
    except (OSError, ValueError):
        return None


def store_reference_time(key: str, entry: dict[str, Any], root: str | os.PathLike[str]) -> None:
    path = _path(key, root)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
