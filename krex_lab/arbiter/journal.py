"""The enforcement journal: what KREX did to other processes, written *before* it does it.

One JSON object per line, appended with a single ``write`` (the page cache keeps it when the
arbiter process dies, which is the failure the journal exists for; a machine crash takes the
frozen processes with it, so no fsync). Entries:

    {"t": "stop",     "region": R, "procs": [[pid, start], ...]}        SIGSTOP sent
    {"t": "cgfreeze", "region": R, "paths": [cgroup dir, ...]}         cgroup.freeze = 1
    {"t": "threads",  "region": R, "threads": [[tid, pid, start, [cpus]]]}  original affinities
    {"t": "lock",     "region": R, "backend": B, "procs": [[pid, start], ...]}
    {"t": "partition", "region": R, "path": P, "procs": [[pid, start, cgroup], ...]}  cpuset shield
    {"t": "irq",      "region": R, "irqs": [[irq, original cpu list], ...]}
    {"t": "kin",      "region": R, "procs": [[pid, start], ...]}        parents a stop may stop
    {"t": "end",      "region": R}                                     all of R undone

(``threads`` names each thread by its process's pid and start time; journals written before
2026-12-01 evening have ``affinity`` entries, ``[[tid, thread start, [cpus]]]``, still undone.)
(``kin``: running ancestors of sessions about to be stopped, written before the stops; a
``runuser``, ``su`` or ``sudo`` waiting with WUNTRACED stops itself when its child stops, and
the undo continues those found stopped, as a region's release does.)
A region without ``end`` is *outstanding*: :func:`undo_outstanding` (run by the guardian when
the arbiter dies, by the supervisor when both die, and by a new arbiter before it serves)
restores affinities, thaws and unlocks everything it names. Every undo step is idempotent and
checks the start time, so a reused pid is never touched.

The journal is opened without following links (:func:`krex_lab.paths.open_private`, mode
0600) and every line is validated against the schema below: a malformed line (torn, not an
object, an unknown kind, a missing or wrongly typed field) is skipped with a warning, and
undo never raises on bad data. A ``cgfreeze`` path is written only if it is a cgroup KREX
manages (:func:`krex_lab.enforcement.cgroups.krex_cgroup_fd`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import msgspec

from ..paths import UnsafePath, open_private

log = logging.getLogger("krex.journal")

UnlockFn = Callable[[str, list[tuple[int, int]]], list[str]]

_MAX_JOURNAL = 64 * 1024 * 1024  # an arbiter truncates after every region; more is not a journal

Pid = Annotated[int, msgspec.Meta(gt=0, le=2**22)]
Tick = Annotated[int, msgspec.Meta(ge=0)]
Cpu = Annotated[int, msgspec.Meta(ge=0, le=65535)]
Name = Annotated[str, msgspec.Meta(max_length=4096)]


class Stop(msgspec.Struct, tag_field="t", tag="stop"):
    region: Name
    procs: list[tuple[Pid, Tick]]


class CgFreeze(msgspec.Struct, tag_field="t", tag="cgfreeze"):
    region: Name
    paths: list[Name]


class Threads(msgspec.Struct, tag_field="t", tag="threads"):
    region: Name
    threads: list[tuple[Pid, Pid, Tick, list[Cpu]]]  # tid, its process, the process's start, cpus


class Affinity(msgspec.Struct, tag_field="t", tag="affinity"):  # before Threads: undone, never written
    region: Name
    threads: list[tuple[Pid, Tick | None, list[Cpu]]]


class Lock(msgspec.Struct, tag_field="t", tag="lock"):
    region: Name
    backend: Name
    procs: list[tuple[Pid, Tick]]


class Partition(msgspec.Struct, tag_field="t", tag="partition"):
    region: Name
    path: Name
    procs: list[tuple[Pid, Tick, Name]]


class Irq(msgspec.Struct, tag_field="t", tag="irq"):
    region: Name
    irqs: list[tuple[Annotated[int, msgspec.Meta(ge=0, le=65535)], Annotated[str, msgspec.Meta(max_length=1024)]]]


class Kin(msgspec.Struct, tag_field="t", tag="kin"):
    region: Name
    procs: list[tuple[Pid, Tick]]


class End(msgspec.Struct, tag_field="t", tag="end"):
    region: Name


Entry = Stop | CgFreeze | Threads | Affinity | Lock | Partition | Irq | Kin | End
_decoder: msgspec.json.Decoder[Entry] = msgspec.json.Decoder(Entry)


class Journal:
    """An append-only journal at ``path``, opened at once unless ``open=False``: the arbiter builds
    its journal with itself and opens it once it holds the runtime dir's lock and has undone
    what an earlier arbiter left (a record before that is a bug and raises)."""

    def __init__(self, path: Path, open: bool = True) -> None:
        self.path = path
        self._fd: int | None = None
        self._open: set[str] = set()
        # The loop and the isolation thread both write: an end that truncates must never fall
        # between another region's write and its being counted open.
        self._lock = threading.Lock()
        #: bytes written since the file was last started afresh
        self.written = 0
        if open:
            self.open()

    def open(self) -> None:
        self._fd = open_private(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    @property
    def fd(self) -> int:
        if self._fd is None:
            raise RuntimeError(f"the journal {self.path} is not open")
        return self._fd

    def record(self, kind: str, region: str, **data: Any) -> None:
        line = msgspec.json.encode({"t": kind, "region": region, **data}) + b"\n"
        with self._lock:
            self._open.add(region)
            os.write(self.fd, line)
            self.written += len(line)

    def end(self, region: str) -> None:
        with self._lock:
            if region in self._open:
                line = msgspec.json.encode({"t": "end", "region": region}) + b"\n"
                os.write(self.fd, line)
                self.written += len(line)
                self._open.discard(region)
            if not self._open:
                # Nothing outstanding: start the file afresh so it never grows without bound.
                os.ftruncate(self.fd, 0)
                self.written = 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def parse(data: bytes, source: str = "journal") -> list[Entry]:
    """Every valid entry of a journal's bytes; each malformed line is skipped with a warning."""
    entries: list[Entry] = []
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entries.append(_decoder.decode(line))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # A torn last line is an action that was never started; anything else is not ours.
            log.warning("%s line %d skipped: %s (%r)", source, n, exc, line[:200])
    return entries


def outstanding(entries: list[Entry]) -> list[Entry]:
    """Entries of regions that have no ``end``, in the order they were written."""
    ended = {e.region for e in entries if isinstance(e, End)}
    return [e for e in entries if e.region not in ended and not isinstance(e, End)]


class UndoSummary(msgspec.Struct, kw_only=True):
    """What an undo of the journal did: how many threads' affinities it restored, processes and
    cgroups it thawed, processes it unlocked, shield parts it ended, and what failed."""

    restored: int = 0
    thawed: int = 0
    unlocked: int = 0
    unshielded: int = 0
    #: parents continued that had stopped themselves when a region stopped their child
    continued: int = 0
    errors: list[str] = []

    @property
    def undid(self) -> bool:
        """Whether anything was undone."""
        return bool(self.restored or self.thawed or self.unlocked or self.unshielded or self.continued)

    # Read access by name, for callers written when the summary was a dict (``summary.thawed``).
    def __getitem__(self, key: str) -> int | list[str]:
        if key not in self.__struct_fields__:
            raise KeyError(key)
        value: int | list[str] = getattr(self, key)
        return value


def read_outstanding(path: Path) -> list[Entry]:
    """Entries of regions that have no ``end``, in the order they were written."""
    try:
        fd = open_private(path, os.O_RDONLY)
    except FileNotFoundError:
        return []
    try:
        return outstanding(parse(_read(fd), str(path)))
    finally:
        os.close(fd)


def undo_outstanding(
    path: Path, unlock: UnlockFn | None = None, *, lock_path: Path | None = None, wait: float = 1.0
) -> UndoSummary:
    """Undo every outstanding action in reverse order of kind: shield (cpuset partitions, IRQs),
    affinity, thaw, unlock.

    Returns a summary (what was restored, thawed, unlocked, and what failed); never raises on
    what the journal holds. Truncates the journal afterwards, through the same no-follow fd.
    With ``lock_path`` (the runtime dir's ``arbiter.lock``; the guardian and the supervisor
    pass it), the undo runs only while that lock is free, holding it: a live arbiter owns its
    journal and is never undone under its feet. Journal readers also serialize on the
    journal's own lock, so two undoers never interleave.
    """
    from ..enforcement.freeze import thaw_cgroups, thaw_procs
    from ..enforcement.isolate import restore_threads
    from ..enforcement.shield import restore_irqs, undo_partitions
    from ..procutil import same_process

    summary = UndoSummary()
    with contextlib.ExitStack() as stack:
        if lock_path is not None:
            try:
                guard = open_private(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            except (OSError, UnsafePath) as exc:
                summary.errors.append(f"cannot open {lock_path}: {exc}")
                return summary
            stack.callback(os.close, guard)
            if not _flock(guard, wait):
                summary.errors.append(f"a live arbiter holds {lock_path}: its journal is left to it")
                return summary
        try:
            fd = open_private(path, os.O_RDWR)
        except FileNotFoundError:
            return summary
        stack.callback(os.close, fd)
        if not _flock(fd, max(wait, 5.0)):
            summary.errors.append(f"{path} stayed locked by another undoer")
            return summary
        entries = outstanding(parse(_read(fd), str(path)))
        first: dict[int, list[Any]] = {}  # the first record of a thread holds its true original affinity
        cgroups: list[str] = []
        stopped: list[tuple[int, int]] = []
        kin: dict[int, int] = {}
        locks: dict[str, list[tuple[int, int]]] = {}
        partitions: list[tuple[str, list[list[Any]]]] = []
        irqs: dict[int, list[Any]] = {}  # the first record of an IRQ holds its true original
        for e in entries:
            if isinstance(e, Threads):
                for tid, pid, start, cpus in e.threads:
                    first.setdefault(tid, [tid, pid, start, cpus])
            elif isinstance(e, Affinity):
                for tid, tstart, cpus in e.threads:
                    first.setdefault(tid, [tid, tstart, cpus])
            elif isinstance(e, CgFreeze):
                cgroups.extend(e.paths)
            elif isinstance(e, Stop):
                stopped.extend(e.procs)
            elif isinstance(e, Kin):
                kin.update(e.procs)
            elif isinstance(e, Lock):
                locks.setdefault(e.backend, []).extend(e.procs)
            elif isinstance(e, Partition):
                partitions.append((e.path, [list(p) for p in e.procs]))
            elif isinstance(e, Irq):
                for irq, original in e.irqs:
                    irqs.setdefault(irq, [irq, original])
        summary.unshielded = _safely(summary, "end cpuset partitions", undo_partitions, partitions)
        summary.unshielded += _safely(summary, "restore IRQ affinities", restore_irqs, list(irqs.values()))
        summary.restored = _safely(summary, "restore affinities", restore_threads, list(first.values()))
        summary.thawed = _safely(summary, "thaw cgroups", thaw_cgroups, cgroups)
        summary.thawed += _safely(summary, "thaw processes", thaw_procs, stopped)
        if kin:
            summary.continued = _safely(summary, "continue parents", _continue_kin_twice, kin)
        for backend, procs in locks.items():
            live = [(pid, start) for pid, start in procs if same_process(pid, start)]
            if not live:
                continue
            if unlock is None:
                summary.errors.append(f"no unlocker for backend {backend}: {len(live)} processes")
                continue
            try:
                errors = unlock(backend, live)
            except Exception as exc:
                errors = [f"unlock ({backend}) failed: {exc}"] * len(live)
            summary.unlocked += len(live) - len(errors)
            summary.errors.extend(errors)
        os.ftruncate(fd, 0)
        if entries:
            log.warning("undid an interrupted region: %s", summary)
    return summary


def _continue_kin_twice(kin: dict[int, int]) -> int:
    """Continue the stopped ``kin`` now and once more shortly after: a parent notices its child's
    stop late on a loaded machine (as the release's later looks do)."""
    from ..enforcement.freeze import continue_kin

    done = set(continue_kin(kin))
    time.sleep(KIN_LOOK)
    return len(done | set(continue_kin(kin)))


#: seconds after the thaw at which an undo looks at the journaled kin again
KIN_LOOK = 0.05


def _safely(summary: UndoSummary, what: str, fn: Callable[[Any], int], arg: Any) -> int:
    try:
        return fn(arg)
    except Exception as exc:  # never let bad data stop an undo half-way
        summary.errors.append(f"{what}: {exc}")
        return 0


def _read(fd: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    os.lseek(fd, 0, os.SEEK_SET)
    for chunk in _chunks(fd):
        chunks.append(chunk)
        size += len(chunk)
        if size > _MAX_JOURNAL:
            log.warning("journal larger than %d bytes: the rest is ignored", _MAX_JOURNAL)
            break
    return b"".join(chunks)


def _chunks(fd: int) -> Iterator[bytes]:
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return
        yield chunk


def _flock(fd: int, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
