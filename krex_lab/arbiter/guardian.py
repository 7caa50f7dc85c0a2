"""The guardian: a separate process that undoes a dead arbiter's enforcement.

Started by the arbiter in a session of its own (so a signal to the arbiter's process group
does not reach it), it waits on a pidfd for the arbiter to exit. If the arbiter leaves
outstanding journal entries (it crashed or was killed inside a region), the guardian
restores affinities, thaws and unlocks everything named there, then exits. A clean arbiter
shutdown leaves an empty journal and the guardian exits quietly.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import time
from pathlib import Path

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


def _unlocker(backend: str, procs: list[tuple[int, int]]) -> list[str]:
    from ..gpu import make_backend
    from ..procutil import same_process

    try:
        be = make_backend(backend)
    except Exception as exc:
        return [f"cannot load backend {backend} to unlock {len(procs)} processes: {exc}"]
    errors = []
    for pid, start in procs:
        if not same_process(pid, start):
            continue
        try:
            be.unlock(pid)
        except Exception as exc:
            errors.append(f"unlock {pid}: {exc}")
    be.close()
    return errors


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="KREX guardian: undo a dead arbiter's enforcement")
    parser.add_argument("--pid", type=int, required=True, help="the arbiter's pid")
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--backend", default="fake")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s krex-guardian %(message)s")
    _wait_for_exit(args.pid)
    summary = undo_outstanding(args.journal, _unlocker)
    if any(summary[k] for k in ("restored", "thawed", "unlocked")) or summary["errors"]:
        log.warning("arbiter %d died inside a region; undone: %s", args.pid, summary)


if __name__ == "__main__":
    main()
