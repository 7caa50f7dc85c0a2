"""GPU MODE problems as published: a directory whose ``task.yml`` lays out the files a submission runs among.

A published problem (GPU MODE's reference kernels) is a directory holding ``task.yml``; its
``files:`` list names each file the runner writes beside the submission and where its text comes
from, relative to the task's directory (``../utils.py`` is shared by a family of problems), the
submission itself standing as ``@SUBMISSION@``. The same file gives the cases (``tests:``,
``benchmarks:``: keyword arguments of ``generate_input``), one time limit per mode
(``test_timeout``, ``benchmark_timeout``, ``ranked_timeout``; seconds, 180 when absent), the
language (``lang``: only ``py`` is run here) and how a leaderboard ranks the benchmarks
(``ranking_by``: ``last``, the default, times the last benchmark alone; ``mean``, ``geom``).

Client side: :func:`find_task` and :func:`read_task` turn a reference path (or the problem's
directory) into a :class:`Task`, whose ``files`` (name -> text) travel in the job. Worker side:
:func:`lay_out` writes them into a private directory and :func:`layout_on_path` puts that
directory first on ``sys.path`` (so ``from utils import ...`` finds the problem's own ``utils``,
never one an earlier problem left in ``sys.modules``). This module imports msgspec alone (PyYAML
when a task is read).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Literal, TypedDict, cast

import msgspec

__all__ = [
    "DEFAULT_TIMEOUT",
    "SUBMISSION",
    "Case",
    "Task",
    "TaskError",
    "TaskInfo",
    "files_digest",
    "find_task",
    "lay_out",
    "layout_modules",
    "layout_on_path",
    "read_task",
]

#: a GPU MODE case: the keyword arguments of the reference's ``generate_input``, as the user wrote them
Case = dict[str, Any]

#: the ``source`` that stands for the submission in ``files:``
SUBMISSION = "@SUBMISSION@"
#: a task.yml's time limit where it names none (seconds, as GPU MODE's runner takes it)
DEFAULT_TIMEOUT = 180.0
#: the time limit a task gives each of our modes
MODE_TIMEOUT = {"test": "test_timeout", "benchmark": "benchmark_timeout", "leaderboard": "ranked_timeout"}
RANKINGS = ("last", "mean", "geom")


class FileEntry(TypedDict, total=False):
    """One of ``files:``: the name the runner writes it under, and where its text comes from."""

    name: str
    source: str


class TaskConfig(TypedDict, total=False):
    #: the runner's harness (GPU MODE's eval.py)
    main: str


class TaskYaml(TypedDict, total=False):
    """A task.yml as published (the keys read here; others are left alone). YAML is the author's,
    so each value is checked where it is read: these are the types it must have."""

    files: list[FileEntry]
    lang: str
    multi_gpu: bool
    ranking_by: str
    config: TaskConfig
    tests: list[Case]
    benchmarks: list[Case]
    test_timeout: float | None
    benchmark_timeout: float | None
    ranked_timeout: float | None


class TaskError(ValueError):
    """A task.yml that cannot be run as it stands: the message names the file and what is wrong."""


class TaskInfo(msgspec.Struct, kw_only=True, frozen=True):
    """What the job carries of its task besides the files: where it was read, which of the
    laid-out files are the submission and the reference, how the benchmarks rank."""

    #: the task.yml read (absolute)
    path: str
    #: the file names the submission and the reference take among the laid-out files
    submission: str
    reference: str
    #: ``last`` (only the last benchmark is timed), ``mean`` or ``geom``
    ranking_by: str = "last"
    #: the task's time limit per mode (seconds)
    timeouts: dict[str, float] = {}


class Task(msgspec.Struct, kw_only=True, frozen=True):
    """One task.yml, read and resolved: every file's text (the submission's included)."""

    info: TaskInfo
    #: file name -> text, as the runner lays them out (the submission under its own name)
    files: dict[str, str]
    #: the reference's text and its path on disk (None: the task gave none of that name)
    reference_text: str
    reference_path: str | None
    tests: list[Case] = []
    benchmarks: list[Case] = []

    def timeout(self, mode: str) -> float:
        """The task's time limit for ``mode`` (``test``, ``benchmark``, ``leaderboard``)."""
        return self.info.timeouts[MODE_TIMEOUT[mode]]

    def timed_benchmarks(self, mode: str) -> list[Case]:
        """The benchmarks GPU MODE's runner would run in ``mode``: ranked by ``last``, the last alone."""
        if mode != "test" and self.info.ranking_by == "last" and self.benchmarks:
            return self.benchmarks[-1:]
        return list(self.benchmarks)


def find_task(path: str | os.PathLike[str]) -> Path | None:
    """The task.yml of a problem: ``path`` is the problem's directory, its task.yml, or a file
    beside one (its reference). None: no task.yml there."""
    p = Path(path)
    if p.is_dir():
        p = p / "task.yml"
    elif p.name not in ("task.yml", "task.yaml"):
        p = p.parent / "task.yml"
    return p if p.is_file() else None


def _yaml(path: Path) -> TaskYaml:
    try:
        import yaml
    except ImportError:
        from ..errors import MissingDependency

        raise MissingDependency.of("pyyaml", "reading a GPU MODE task.yml", "pip install 'krex-lab[eval]'") from None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise TaskError(f"{path}: not YAML: {exc}") from None
    if not isinstance(data, dict):
        raise TaskError(f"{path}: a task.yml is a mapping (files:, tests:, benchmarks:, ...)")
    return cast(TaskYaml, data)  # its values are checked as read


def _name(entry_name: Any, path: Path) -> str:
    """A laid-out file's name: relative, inside the directory (GPU MODE's runner checks the same)."""
    if not isinstance(entry_name, str) or not entry_name:
        raise TaskError(f"{path}: files: every entry needs a name, not {entry_name!r}")
    pure = PurePosixPath(entry_name)
    if pure.is_absolute() or ".." in pure.parts or "\\" in entry_name:
        raise TaskError(f"{path}: files: {entry_name!r} would be written outside the problem's directory")
    return str(pure)


def _cases(data: TaskYaml, key: Literal["tests", "benchmarks"], path: Path) -> list[Case]:
    listed = data.get(key) or []
    if not isinstance(listed, list) or not all(isinstance(c, Mapping) for c in listed):
        raise TaskError(f"{path}: {key}: a list of mappings (generate_input's keyword arguments)")
    return [dict(c) for c in listed]


def _timeouts(data: TaskYaml, path: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in MODE_TIMEOUT.values():
        value = data.get(key, DEFAULT_TIMEOUT)
        if value is None:
            value = DEFAULT_TIMEOUT
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise TaskError(f"{path}: {key}: seconds > 0, not {value!r}")
        out[key] = float(value)
    return out


def _source_file(path: Path, name: str, source: str) -> Path:
    """Where a laid-out file's text is: ``source`` relative to the task's directory, as published
    (``../utils.py`` shared by a family of problems), or else the file of that name beside the
    task.yml, as a runner gathers a problem into one directory (task.yml, reference.py and utils.py
    together). Neither there: a FileNotFoundError naming both places."""
    src = (path.parent / source).resolve()
    if src.is_file():
        return src
    beside = (path.parent / name).resolve()
    if beside.is_file() and beside.is_relative_to(path.parent.resolve()):
        return beside
    raise FileNotFoundError(
        f"{path}: files: {name!r} comes from {source!r}, which is not a file ({src}), "
        f"and no {name} lies beside the task.yml ({beside}) as in a problem gathered into one directory"
    )


def read_task(task_yml: str | os.PathLike[str], candidate_text: str, reference: str | None = None) -> Task:
    """``task_yml`` read and resolved: each of ``files:`` read relative to the task's directory,
    ``@SUBMISSION@`` standing for ``candidate_text``. ``reference``: the reference's path when the
    caller named one (default: the file laid out as ``reference.py``). Raises :class:`TaskError`
    (a ValueError) naming the file and the fault, FileNotFoundError for a file it lists that is
    not there."""
    path = Path(task_yml).resolve()
    data = _yaml(path)
    lang = str(data.get("lang", "py"))
    if lang != "py":
        raise TaskError(f"{path}: lang {lang!r}: only Python tasks (lang: py) are run; CUDA goes through load_inline")
    if data.get("multi_gpu"):
        raise TaskError(f"{path}: multi_gpu tasks need several GPUs in one evaluation, which is not supported")
    ranking = str(data.get("ranking_by") or "last")
    if ranking not in RANKINGS:
        raise TaskError(f"{path}: ranking_by {ranking!r}: one of {', '.join(RANKINGS)}")
    timeouts = _timeouts(data, path)
    tests, benchmarks = _cases(data, "tests", path), _cases(data, "benchmarks", path)
    entries = data.get("files")
    if not isinstance(entries, list) or not entries:
        raise TaskError(f"{path}: files: the list of files laid out beside the submission is missing")
    config = data.get("config")
    #: the runner's harness (``config: main:``, GPU MODE's eval.py): never run here, so a gathered
    #: problem may leave it out
    main = str(config.get("main") or "") if isinstance(config, Mapping) else ""
    files: dict[str, str] = {}
    origin: dict[str, Path] = {}
    submission: str | None = None
    for entry in entries:
        if not isinstance(entry, Mapping) or "source" not in entry:
            raise TaskError(f"{path}: files: each entry is {{name: ..., source: ...}}, not {entry!r}")
        name, source = _name(entry.get("name"), path), str(entry["source"])
        if name in files:
            raise TaskError(f"{path}: files: {name!r} is listed twice")
        if source == SUBMISSION:
            submission, files[name] = name, candidate_text
            continue
        try:
            src = _source_file(path, name, source)
        except FileNotFoundError:
            if name == main:  # the runner's own harness: the judge stands in for it
                continue
            raise
        files[name], origin[name] = src.read_text(encoding="utf-8", errors="replace"), src
    if submission is None:
        raise TaskError(f"{path}: files: no entry has source {SUBMISSION} (where the submission goes)")
    ref_path = Path(reference).resolve() if reference is not None else None
    ref_name = next((n for n, p in origin.items() if ref_path is not None and p == ref_path), None)
    if ref_name is None and ref_path is None:
        ref_name = "reference.py" if "reference.py" in origin else None
        if ref_name is None:
            raise TaskError(f"{path}: files: no reference.py to evaluate against (name the reference's path)")
    if ref_path is not None and ref_name is None:  # a reference of the caller's own, beside the task
        ref_name, ref_text = ref_path.name, ref_path.read_text(encoding="utf-8", errors="replace")
        files.setdefault(ref_name, ref_text)
    else:
        assert ref_name is not None
        ref_text, ref_path = files[ref_name], origin[ref_name]
    info = TaskInfo(path=str(path), submission=submission, reference=ref_name, ranking_by=ranking, timeouts=timeouts)
    return Task(
        info=info,
        files=files,
        reference_text=ref_text,
        reference_path=str(ref_path),
        tests=tests,
        benchmarks=benchmarks,
    )


def files_digest(files: Mapping[str, str]) -> str:
    """One hash of a layout (names and texts): what a worker keys a reference module by, with
    the reference's own hash, since the same reference may import another problem's ``utils``."""
    h = hashlib.sha256()
    for name in sorted(files):
        data = files[name].encode("utf-8", errors="replace")
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def lay_out(files: Mapping[str, str], directory: str | os.PathLike[str], *, skip: Iterable[str] = ()) -> list[str]:
    """Write ``files`` (name -> text) into ``directory`` (made private, 0700, if it is not there),
    except the names in ``skip`` (the judge skips the submission: it never imports candidate code).
    A file already there with other text is replaced (written beside, then renamed over). Returns
    the paths written. A name that would land outside ``directory`` is a ValueError, and nothing is
    written."""
    root = Path(directory)
    skipped = set(skip)
    targets: list[tuple[Path, str]] = []
    for name, text in files.items():
        pure = PurePosixPath(name)
        if not name or pure.is_absolute() or ".." in pure.parts or "\\" in name:
            raise ValueError(f"file name {name!r} would be written outside {root}")
        if name not in skipped:
            targets.append((root.joinpath(*pure.parts), text))
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    written: list[str] = []
    for target, text in targets:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        data = text.encode("utf-8")
        with contextlib.suppress(OSError):
            if not target.is_symlink() and target.is_file() and target.read_bytes() == data:
                written.append(str(target))
                continue
        # made new (O_EXCL): a link or a pipe found under the partial's name is never written through
        partial = target.with_name(f".{target.name}.{os.getpid()}.part")
        partial.unlink(missing_ok=True)
        with open(partial, "xb") as f:
            f.write(data)
        os.replace(partial, target)
        written.append(str(target))
    return written


def layout_modules(files: Iterable[str]) -> set[str]:
    """The top-level module names a layout provides (``utils.py`` -> ``utils``, ``pkg/x.py`` -> ``pkg``)."""
    names: set[str] = set()
    for name in files:
        first = PurePosixPath(name).parts[0]
        if first.endswith(".py"):
            names.add(first[:-3])
        elif len(PurePosixPath(name).parts) > 1:
            names.add(first)
    return names


@contextlib.contextmanager
def layout_on_path(directory: str | os.PathLike[str], files: Iterable[str]) -> Iterator[None]:
    """``directory`` first on ``sys.path`` for the block, and every module the layout provides
    dropped from ``sys.modules`` on entry and on exit, so that ``import utils`` finds this
    problem's file and no later job finds it (a warm worker runs many problems)."""
    names = layout_modules(files)
    entry = os.fspath(directory)

    def forget() -> None:
        for mod in [m for m in sys.modules if m.split(".", 1)[0] in names]:
            del sys.modules[mod]

    forget()
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)
        forget()
