"""Where evaluations keep things between calls: build directories and reference times.

``$KREX_EVAL_CACHE`` (default ``$XDG_CACHE_HOME/krex/evaluate``, else ``~/.cache/krex/evaluate``):

* ``builds/<candidate hash>/``: each candidate's build directory (its ``TORCH_EXTENSIONS_DIR``
  and working directory), its own for one evaluation, and beside it what its compilers made
  while it loaded, so the same source is not compiled twice (:mod:`.judge.builddir`);
* ``outputs/<job id>.txt``: a candidate's stdout and stderr, read by the caller, then removed;
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

import msgspec

from .outcomes import ReferenceEntry, ReferenceKey

__all__ = [
    "builds_dir",
    "cache_dir",
    "make_output_file",
    "output_file",
    "reference_key",
    "reference_time",
    "store_reference_time",
]


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


def output_file(build_root: str, job_id: str) -> str:
    """Where the candidate's output of job ``job_id`` goes (the judge makes it, the caller reads it)."""
    return os.path.join(os.path.dirname(build_root), "outputs", f"{job_id}.txt")


def make_output_file(path: str) -> None:
    """The empty output file, new (an existing one, or a link, is replaced)."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))


def reference_key(parts: ReferenceKey) -> str:
    """A file name for the reference time of everything in ``parts`` (hash, device, method, ...):
    the hash of its fields as sorted JSON."""
    plain = msgspec.to_builtins(parts)
    return hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:40]


def _path(key: str, root: str | os.PathLike[str]) -> Path:
    return Path(root) / "reference-times" / f"{key}.json"


def reference_time(key: str, root: str | os.PathLike[str]) -> ReferenceEntry | None:
    """The cached entry under cache directory ``root`` or None (none, or not readable as one)."""
    try:
        return msgspec.json.decode(_path(key, root).read_bytes(), type=ReferenceEntry)
    except (OSError, msgspec.DecodeError):
        return None


def store_reference_time(key: str, entry: ReferenceEntry, root: str | os.PathLike[str]) -> None:
    path = _path(key, root)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(msgspec.json.encode(entry))
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
