"""The enforcement journal: what KREX did to other processes, written *before* it does it.

One JSON object per line, appended with a single ``write`` (the page cache keeps it when the
arbiter process dies, which is the failure the journal exists for; a machine crash takes the
frozen processes with it, so no fsync). Entries:

    {"t": "stop",     "region": R, "procs": [[pid, start], ...]}        SIGSTOP sent
    {"t": "cgfreeze", "region": R, "paths": [cgroup dir, ...]}         cgroup.freeze = 1
    {"t": "affinity", "region": R, "threads": [[tid, start, [cpus]]]}  original affinities
    {"t": "lock",     "region": R, "backend": B, "procs": [[pid, start], ...]}
    {"t": "end",      "region": R}                                     all of R undone

A region without ``end`` is *outstanding*: :func:`undo_outstanding` (run by the guardian when
the arbiter dies, and by a new arbiter before it serves) restores affinities, thaws and
unlocks everything it names. Every undo step is idempotent and checks the start time, so a
reused pid is never touched.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger("krex.journal")

UnlockFn = Callable[[str, list[tuple[int, int]]], list[str]]


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._open: set[str] = set()

    def record(self, kind: str, region: str, **data: Any) -> None:
        line = json.dumps({"t": kind, "region": region, **data}, separators=(",", ":")) + "\n"
        os.write(self._fd, line.encode())
        self._open.add(region)

    def end(self, region: str) -> None:
        if region in self._open:
            self.record("end", region)
            self._open.discard(region)
        if not self._open:
            # Nothing outstanding: start the file afresh so it never grows without bound.
            os.ftruncate(self._fd, 0)

    def close(self) -> None:
        os.close(self._fd)


def read_outstanding(path: Path) -> list[dict[str, Any]]:
    """Entries of regions that have no ``end``, in the order they were written."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    entries: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue  # a torn last line: the action it announced was never started
    ended = {e["region"] for e in entries if e.get("t") == "end"}
    return [e for e in entries if e.get("region") not in ended and e.get("t") != "end"]


def undo_outstanding(path: Path, unlock: UnlockFn | None = None) -> dict[str, Any]:
    """Undo every outstanding action in reverse order of kind: affinity, thaw, unlock.

    Returns a summary (what was restored, thawed, unlocked, and what failed). Truncates the
    journal afterwards.
    """
    from ..regions.freeze import thaw_cgroups, thaw_procs
    from ..regions.isolate import restore_threads

    entries = read_outstanding(path)
    summary: dict[str, Any] = {"restored": 0, "thawed": 0, "unlocked": 0, "errors": []}
    threads = [t for e in entries if e["t"] == "affinity" for t in e["threads"]]
    # The first record of a thread holds its true original affinity.
    first: dict[int, list[Any]] = {}
    for tid, start, cpus in threads:
        first.setdefault(tid, [tid, start, cpus])
    summary["restored"] = restore_threads(first.values())
    summary["thawed"] = thaw_cgroups(_flat(e["paths"] for e in entries if e["t"] == "cgfreeze"))
    summary["thawed"] += thaw_procs(_pairs(e["procs"] for e in entries if e["t"] == "stop"))
    locks: dict[str, list[tuple[int, int]]] = {}
    for e in entries:
        if e["t"] == "lock":
            locks.setdefault(e["backend"], []).extend(tuple(p) for p in e["procs"])
    for backend, procs in locks.items():
        if unlock is None:
            summary["errors"].append(f"no unlocker for backend {backend}: {len(procs)} processes")
            continue
        errors = unlock(backend, procs)
        summary["unlocked"] += len(procs) - len(errors)
        summary["errors"].extend(errors)
    path.write_text("")
    if entries:
        log.warning("undid an interrupted region: %s", summary)
    return summary


def _flat(groups: Iterable[list[str]]) -> list[str]:
    return [x for g in groups for x in g]


def _pairs(groups: Iterable[list[list[int]]]) -> list[tuple[int, int]]:
    return [(int(p[0]), int(p[1])) for g in groups for p in g]
