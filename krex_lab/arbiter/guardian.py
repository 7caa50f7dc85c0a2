"""The guardian: a separate process that undoes a dead arbiter's enforcement.

Started by the arbiter in a session of its own (so a signal to the arbiter's process group
does not reach it), it waits on a pidfd for the arbiter to exit. If the arbiter leaves
outstanding journal entries (it crashed or was killed inside a region), the guardian
restores affinities, thaws and unlocks everything named there, then exits. A clean arbiter
shutdown leaves an empty journal and the guardian exits quietly.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import os
import select
import time
from collections.abc import Callable
from pathlib import Path

from ..gpu import GpuBackend, make_backend
from ..procutil import same_process
from ..regions import freeze as _freeze  # noqa: F401 - loaded before they are needed
from .journal import undo_outstanding

log = logging.getLogger("krex.guardian")


def _wait_for_exit(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, ProcessLookupError, OSError):
        while os.path.exists(f"/proc/{pid}"):
            time.sleep(0.02)
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


class _Unlocker:
    """Unlocks journaled processes with a backend loaded *before* the arbiter dies (cuInit and
    NVML take a while; the 1 s budget starts at the arbiter's death), in parallel threads."""

    def __init__(self, backend: str) -> None:
        self.name = backend
        self.backend: GpuBackend | None = None
        self.error = ""
        if backend == "fake":
            return
        try:
            self.backend = make_backend(backend)
        except Exception as exc:
            self.error = f"cannot load backend {backend}: {exc}"

    def __call__(self, backend: str, procs: list[tuple[int, int]]) -> list[str]:
        be = self.backend
        if be is None or backend != self.name:
            return [self.error or f"no {backend} backend in this guardian: {len(procs)} processes left locked"]
        live = [pid for pid, start in procs if same_process(pid, start)]
        with concurrent.futures.ThreadPoolExecutor(max(1, min(16, len(live)))) as pool:
            outcomes = list(pool.map(lambda pid: _try(be.unlock, pid), live))
        return [f"unlock {pid}: {err}" for pid, err in zip(live, outcomes) if err]


def _try(fn: Callable[[int], None], pid: int) -> str:
    try:
        fn(pid)
        return ""
    except Exception as exc:
        return str(exc)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="KREX guardian: undo a dead arbiter's enforcement")
    parser.add_argument("--pid", type=int, required=True, help="the arbiter's pid")
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--backend", default="fake")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s krex-guardian %(message)s")
    unlocker = _Unlocker(args.backend)
    _wait_for_exit(args.pid)
    summary = undo_outstanding(args.journal, unlocker)
    if any(summary[k] for k in ("restored", "thawed", "unlocked")) or summary["errors"]:
        log.warning("arbiter %d died inside a region; undone: %s", args.pid, summary)
    if unlocker.backend is not None:
        unlocker.backend.close()


if __name__ == "__main__":
    main()
