"""The built-in supervisor: keeps an arbiter running where no systemd unit does.

    python -I -m krex_lab.arbiter.supervisor --runtime-dir /run/krex -- krex arbiter --multi-user

It runs the arbiter command as its child. The guardian undoes a dead arbiter's enforcement,
and the arbiter restarts a dead guardian; when both die together (one SIGKILL to both, an
OOM kill of the unit) nobody is left to undo, which is what this process is for. Whenever the
child exits, the supervisor first undoes the journal (``<runtime dir>/journal.jsonl``) itself,
exactly as the guardian would (only while no live arbiter holds ``arbiter.lock``), then:

* exit code 0 (a clean stop after SIGTERM/SIGINT): the supervisor exits 0 too;
* anything else: it restarts the command, after a backoff that doubles with each quick death
  (up to 30 s), at most ``--max-restarts`` times per ``--window`` seconds (then it gives up,
  exit 1). Each restart is logged with why: the exit code or signal, and the child's last line
  on stderr (which the supervisor relays), e.g. libzmq's ``Too many open files``.

SIGTERM, SIGINT and SIGHUP are forwarded to the child (SIGHUP as SIGTERM); the supervisor then
waits for it and exits with its status. ``--undo-only`` undoes the journal and exits (systemd's
``ExecStopPost=`` uses it).

Safe to run as root: the journal is replayed only from a runtime dir that no other user could
have written (:func:`krex_lab.paths.check_private_dir`), opened without following links; the
child starts in ``/`` (a user-writable working directory could shadow Python modules), and as
root the umask is 0077 so that nothing the arbiter writes (journal, logs) is world-readable.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .. import paths
from ..enforcement import freeze as _freeze  # noqa: F401 - loaded before they are needed
from ..enforcement import isolate as _isolate  # noqa: F401
from ..errors import KrexError
from .guardian import _Unlocker
from .journal import UndoSummary, undo_outstanding

DESCRIPTION = "Run a KREX arbiter, undo its journal whenever it exits and restart it unless it stopped cleanly."

log = logging.getLogger("krex.supervisor")

_QUICK = 10.0  # a child that lived less than this counts towards the backoff
#: the longest wait before a restart (each quick death doubles it)
_MAX_DELAY = 30.0


def _exit_reason(rc: int) -> str:
    """How the child ended, in words: an exit code, or the signal that killed it."""
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with {rc}"


class _LastWords:
    """Copies the child's stderr to ours line by line, keeping the last lines: what an arbiter
    that aborts prints last (libzmq's assertion, a traceback's last line) says why it died."""

    def __init__(self, stream: Any) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=3)
        self._thread = threading.Thread(target=self._copy, args=(stream,), daemon=True)
        self._thread.start()

    def _copy(self, stream: Any) -> None:
        out = sys.stderr.buffer
        for line in iter(stream.readline, b""):
            try:
                out.write(line)
                out.flush()
            except (OSError, ValueError):
                pass
            text = line.decode(errors="replace").strip()
            if text:
                self.lines.append(text)
        stream.close()

    def said(self) -> str:
        # The pipe ends with the child, unless a process it started keeps it (its guardian): wait
        # briefly, the undo must not wait for the last words.
        self._thread.join(0.1)
        return self.lines[-1] if self.lines else ""


class _Unlockers:
    """One :class:`_Unlocker` per backend named by the journal, loaded the first time it is needed
    (``preload`` ones at start, so that a crash does not wait for cuInit or NVML)."""

    def __init__(self, preload: list[str]) -> None:
        self._by_name: dict[str, _Unlocker] = {name: _Unlocker(name) for name in preload}

    def __call__(self, backend: str, procs: list[tuple[int, int]]) -> list[str]:
        if backend not in self._by_name:
            self._by_name[backend] = _Unlocker(backend)
        return self._by_name[backend](backend, procs)

    def close(self) -> None:
        for u in self._by_name.values():
            if u.backend is not None:
                u.backend.close()


def undo(runtime: Path, unlock: _Unlockers | None = None) -> UndoSummary:
    """Undo what the journal of ``runtime`` names (if the directory is safe and no live arbiter
    holds its lock). Never raises; returns the summary."""
    summary = UndoSummary()
    if not os.path.lexists(runtime):
        return summary
    try:
        paths.check_private_dir(runtime)
    except (OSError, KrexError) as exc:
        summary.errors.append(f"journal not replayed: {exc}")
        log.error("journal not replayed: %s", exc)
        return summary
    try:
        summary = undo_outstanding(runtime / "journal.jsonl", unlock, lock_path=runtime / "arbiter.lock")
    except (OSError, KrexError) as exc:
        summary.errors.append(f"journal not replayed: {exc}")
        log.error("journal not replayed: %s", exc)
    if summary.undid or summary.errors:
        log.warning("undone after the arbiter exited: %s", summary)
    return summary


class Supervisor:
    def __init__(self, command: list[str], runtime: Path, max_restarts: int, window: float, unlock: _Unlockers) -> None:
        self.command = command
        self.runtime = runtime
        self.max_restarts = max_restarts
        self.window = window
        self.unlock = unlock
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.restarts: collections.deque[float] = collections.deque()
        self.last_words: _LastWords | None = None

    def _forward(self, signum: int, _frame: Any) -> None:
        self.stopping = True
        child = self.child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)

    def _start(self) -> subprocess.Popen[bytes]:
        log.info("starting %s", " ".join(self.command))
        # The arbiter must use the runtime dir whose journal this supervisor undoes (an explicit
        # --runtime-dir in the command still wins over the environment).
        env = {**os.environ, paths.RUNTIME_DIR_ENV: str(self.runtime)}
        child = subprocess.Popen(self.command, cwd="/", stdin=subprocess.DEVNULL, env=env, stderr=subprocess.PIPE)
        self.last_words = _LastWords(child.stderr)
        return child

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._forward)
        undo(self.runtime, self.unlock)  # what an arbiter killed with its supervisor left behind
        delay = 0.1
        while True:
            started = time.monotonic()
            try:
                self.child = self._start()
            except OSError as exc:
                log.error("cannot start %s: %s", self.command[0], exc)
                return 1
            rc = self.child.wait()
            said = self.last_words.said() if self.last_words is not None else ""
            undo(self.runtime, self.unlock)
            if rc == 0 or self.stopping:
                log.info("arbiter exited with %d%s", rc, " (stop requested)" if self.stopping else "")
                return 0 if rc == 0 else 128 - rc if rc < 0 else rc
            now = time.monotonic()
            self.restarts.append(now)
            while self.restarts and now - self.restarts[0] > self.window:
                self.restarts.popleft()
            why = f"the arbiter {_exit_reason(rc)} after {now - started:.1f} s" + (
                f" (it said: {said})" if said else ""
            )
            if len(self.restarts) > self.max_restarts:
                log.error("%s; %d restarts within %.0f s: giving up", why, len(self.restarts) - 1, self.window)
                return 1
            # An arbiter that keeps dying (a flood that comes back with each restart, a bad
            # configuration) is restarted ever more slowly, and each restart says why.
            delay = delay * 2 if now - started < _QUICK else 0.1
            delay = min(delay, _MAX_DELAY)
            backoff = f"{len(self.restarts)} exits within {self.window:.0f} s, backing off: " if delay > 0.2 else ""
            log.warning("%s; %srestarting in %.1f s", why, backoff, delay)
            deadline = time.monotonic() + delay
            while not self.stopping and time.monotonic() < deadline:
                time.sleep(0.02)
            if self.stopping:
                return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The supervisor's options (``krex supervise`` and ``python -m krex_lab.arbiter.supervisor``)."""
    parser.add_argument(
        "--runtime-dir",
        type=Path,
        default=None,
        help="the arbiter's runtime dir (journal.jsonl, arbiter.lock); default as the arbiter's",
    )
    parser.add_argument("--max-restarts", type=int, default=10, help="restarts allowed per window (default 10)")
    parser.add_argument("--window", type=float, default=60.0, help="window of --max-restarts in s (default 60)")
    parser.add_argument(
        "--backend",
        action="append",
        default=[],
        help="GPU backend to load at start for unlocking (nvidia, amd); repeatable",
    )
    parser.add_argument("--undo-only", action="store_true", help="undo the journal and exit (ExecStopPost=)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the arbiter command")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s krex-supervisor %(message)s")
    if os.geteuid() == 0:
        os.umask(0o077)
    runtime: Path = args.runtime_dir or paths.runtime_dir(create=False)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    unlock = _Unlockers(args.backend)
    try:
        if args.undo_only:
            summary = undo(runtime, unlock)
            return 1 if summary.errors else 0
        if not command:
            if parser is not None:
                parser.error("no arbiter command given (after --)")
            print("krex supervise: no arbiter command given (after --)", file=sys.stderr)
            return 2
        return Supervisor(command, runtime, args.max_restarts, args.window, unlock).run()
    finally:
        unlock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m krex_lab.arbiter.supervisor",
        description=DESCRIPTION,
        epilog="Example: krex supervise --runtime-dir /run/krex -- krex arbiter --multi-user",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv), parser)


if __name__ == "__main__":
    sys.exit(main())
