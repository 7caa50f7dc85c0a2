"""The guardian: a separate process that undoes a dead arbiter's enforcement.

Started by the arbiter in a session of its own (so a signal to the arbiter's process group
does not reach it), it waits on a pidfd for the arbiter to exit. If the arbiter leaves
outstanding journal entries (it crashed or was killed inside a region), the guardian
restores affinities, thaws and unlocks everything named there, then exits. A clean arbiter
shutdown leaves an empty journal and the guardian exits quietly.

The guardian replays a journal only from a runtime directory that no other user could have
written (:func:`krex_lab.paths.check_private_dir`), and only while no live arbiter holds the
directory's ``arbiter.lock`` (a new arbiter, started by the supervisor or systemd, owns the
journal from then on).

SIGTERM does not cut an undo short. It means "exit once there is nothing left to undo": if
the arbiter is already dead (systemd's ``KillMode=control-group`` sends SIGTERM to every
process of the unit after its main process crashed) the guardian undoes, then exits; if the
arbiter is alive and its journal empty (a clean shutdown) it exits at once; otherwise it keeps
guarding for up to ``--term-grace`` seconds, while the arbiter shuts its regions down. SIGINT
and SIGHUP are ignored: the guardian lives in a session of its own, and a terminal going away
must not take it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import logging
import os
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path

from ..enforcement import freeze as _freeze  # noqa: F401 - loaded before they are needed
from ..enforcement.corelock import let_go
from ..errors import KrexError
from ..gpu import GpuBackend, make_backend
from ..gpu.vendors import vendors
from ..paths import check_private_dir
from ..procutil import same_process
from .journal import read_outstanding, undo_outstanding

log = logging.getLogger("krex.guardian")


class _Unlocker:
    """Unlocks journaled processes with a backend loaded *before* the arbiter dies (cuInit and
    NVML take a while; the 1 s budget starts at the arbiter's death), in parallel threads."""

    def __init__(self, backend: str) -> None:
        self.name = backend
        self.backend: GpuBackend | None = None
        self.error = ""
        known = vendors().get(backend)
        if known is not None and known.simulated:
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


def _outstanding(journal: Path) -> bool:
    try:
        return bool(read_outstanding(journal))
    except (OSError, KrexError):
        return True


def _catch_signals() -> tuple[int, list[float]]:
    """SIGTERM only records its time (and wakes the wait through a pipe); SIGINT, SIGHUP ignored."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    terms: list[float] = []
    signal.signal(signal.SIGTERM, lambda *_: terms.append(time.monotonic()))
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    return wake_r, terms


def _guard(pidfd: int | None, pid: int, journal: Path, term_grace: float, wake_r: int, terms: list[float]) -> bool:
    """Wait until the arbiter is dead (True) or SIGTERM says to leave with nothing to undo (False)."""

    def dead() -> bool:
        if pidfd is None:
            return not os.path.exists(f"/proc/{pid}")
        return bool(select.select([pidfd], [], [], 0)[0])

    while True:
        waitables = [wake_r] + ([pidfd] if pidfd is not None else [])
        timeout = 0.05 if terms or pidfd is None else None
        select.select(waitables, [], [], timeout)
        with contextlib.suppress(BlockingIOError):
            os.read(wake_r, 64)
        if dead():
            return True
        if terms:
            if not _outstanding(journal):
                log.info("SIGTERM with nothing outstanding: exiting")
                return False
            if time.monotonic() - terms[0] > term_grace:
                log.error(
                    "SIGTERM: arbiter %d still alive with outstanding entries after %.1f s; leaving them "
                    "to it (or to its supervisor)",
                    pid,
                    term_grace,
                )
                return False


def _say_ready() -> None:
    """One line on stdout once the signals are caught and the backend is loaded: the arbiter serves
    only after it (a guardian stopped or signalled while still starting could not undo). Then
    stdout is let go, so that the arbiter's end of the pipe sees it closed."""
    try:
        os.write(1, b"ready\n")
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass  # no stdout (started by hand, closed): nobody waits for the line


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="KREX guardian: undo a dead arbiter's enforcement")
    parser.add_argument("--pid", type=int, required=True, help="the arbiter's pid")
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--backend", default="fake")
    parser.add_argument(
        "--core-lock-fd",
        type=int,
        default=-1,
        help="the arbiter's core lock, inherited: held (if the arbiter held it) until the undo is done",
    )
    parser.add_argument(
        "--term-grace",
        type=float,
        default=5.0,
        help="after SIGTERM, how long to keep guarding a live arbiter with outstanding entries",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s krex-guardian %(message)s")
    wake_r, terms = _catch_signals()
    journal: Path = args.journal
    try:
        check_private_dir(journal.parent)
    except (OSError, KrexError) as exc:
        log.error("refusing to guard %s: %s", journal, exc)
        raise SystemExit(2) from None
    pidfd: int | None = None
    try:
        pidfd = os.pidfd_open(args.pid)
        gone = False
    except ProcessLookupError:
        gone = True  # already gone: undo at once
    except OSError:
        gone = not os.path.exists(f"/proc/{args.pid}")  # no pidfd: poll /proc
    unlocker = _Unlocker(args.backend)
    _say_ready()
    arbiter_dead = False
    try:
        arbiter_dead = gone or _guard(pidfd, args.pid, journal, args.term_grace, wake_r, terms)
        if arbiter_dead:
            try:
                summary = undo_outstanding(journal, unlocker, lock_path=journal.parent / "arbiter.lock")
            except (OSError, KrexError) as exc:
                log.error("journal %s not replayed: %s", journal, exc)
                raise SystemExit(2) from None
            if summary.undid or summary.errors:
                log.warning("arbiter %d died inside a region; undone: %s", args.pid, summary)
    finally:
        if args.core_lock_fd >= 0:
            # Dropped only for a dead arbiter: a live one may be holding it for a region (closing
            # this descriptor leaves the lock to the arbiter's own).
            if arbiter_dead:
                let_go(args.core_lock_fd)
            else:
                os.close(args.core_lock_fd)
        if unlocker.backend is not None:
            unlocker.backend.close()


if __name__ == "__main__":
    main()
