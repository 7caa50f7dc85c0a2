"""Starting a KREX service (an arbiter, a pool) as a child process, and waiting until it answers.

One way for every starter: the server extension (its embedded arbiter and pool service), Ray's
node service, the pool client (a pool started on demand) and the test plugin's arbiter.

- :func:`start` runs a command with nothing on stdin and its output appended to a log file;
  the child keeps a descriptor of its own, so the log never fills a pipe nobody reads.
- A child that must end with its parent gets a signal from the kernel when the parent dies
  (``PR_SET_PDEATHSIG``), in one of two ways: :func:`command` with ``parent`` runs the module
  under this module's guard (``python -m krex_lab.launcher PPID MODULE ARGS…``: SIGTERM, so the
  child ends as it does at a normal stop, undoing what it did; no code runs in the parent between
  fork and exec, so any parent may use it, a threaded one too), and :func:`start` with
  ``kill_with_parent`` sets SIGKILL between fork and exec (a node lost with Ray loses its
  services as a crash would, and the arbiter's guardian undoes what its regions did).
- :func:`wait_until` polls until the child answers, it exits, or the time is up.
- :func:`stop` sends SIGTERM, waits, then SIGKILL.
- :class:`ManagedProcess` is a service kept as a child from start to stop, with what it left
  behind killed at its stop (the server extension's arbiter and pool).
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from logging import Logger, LoggerAdapter

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1


def command(module: str, *args: str, parent: int | None = None) -> list[str]:
    """``python -m module args``; with ``parent`` (a pid), run under the guard, which ends it with
    SIGTERM when that process dies, however it dies."""
    if parent is None:
        return [sys.executable, "-m", module, *args]
    return [sys.executable, "-m", __name__, str(parent), module, *args]


def start(
    cmd: list[str],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    new_session: bool = False,
    kill_with_parent: bool = False,
    private_log: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``cmd``: stdin from /dev/null, stdout and stderr appended to ``log`` (made 0600 with
    ``private_log``). ``new_session``: its own session, so a terminal's Ctrl-C reaches only the
    parent (which relays what it means). ``kill_with_parent``: SIGKILL when the parent dies."""
    with open(log, "ab") as out:  # the child keeps a descriptor of its own
        if private_log:
            os.chmod(log, 0o600)
        return subprocess.Popen(
            cmd,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,
            preexec_fn=_killed_with_parent if kill_with_parent else None,
        )


def wait_until(
    answers: Callable[[], T | None], alive: Callable[[], bool], timeout: float, interval: float = 0.05
) -> T | None:
    """Poll ``answers`` until it returns something true, which is returned; None once ``alive``
    says the child is gone, or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = answers()
        if result:
            return result
        if not alive():
            return None
        time.sleep(interval)
    return None


def stop(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM (a service ends its work and undoes what it did), then SIGKILL after ``timeout`` s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _killed_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _ended_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent still stops it at its own stop
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        sys.exit(0)


class ManagedProcess:
    """A service that its starter keeps as a child: started under this module's guard in a session
    of its own (so the terminal's Ctrl-C is the starter's to relay), its log tail readable, and
    stopped with everything it left behind (:meth:`stop`). The server extension's arbiter and pool."""

    def __init__(
        self,
        name: str,
        module: str,
        args: list[str],
        env: dict[str, str],
        log_path: Path,
        logger: Logger | LoggerAdapter[Any],
    ) -> None:
        self.log = logger
        self.name = name
        self.module = module
        self.args = args
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, say: bool = True) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = command(self.module, *self.args, parent=os.getpid())
        self.proc = start(cmd, self.log_path, env=self.env, new_session=True, private_log=True)
        if say:
            self.log.info("KREX: started %s (pid %d), log %s", self.name, self.proc.pid, self.log_path)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    async def stop(self, timeout: float) -> None:
        """SIGTERM, wait ``timeout`` s, then SIGKILL it and whatever it left behind (continued first)."""
        import asyncio

        import psutil

        proc = self.proc
        if proc is None:
            return
        try:
            descendants = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            descendants = []
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                self.log.warning(
                    "KREX: %s (pid %d) did not exit within %.0f s: killing it", self.name, proc.pid, timeout
                )
                proc.kill()
                proc.wait()
        # Grace for children that exit on their own once their parent is gone, then no mercy.
        deadline = time.monotonic() + min(timeout, 2.0)
        while any(_running(p) for p in descendants) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for p in descendants:
            if _running(p):
                self.log.warning("KREX: killing pid %d left behind by %s", p.pid, self.name)
                try:
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                except psutil.Error:
                    pass
        self.log.info("KREX: %s stopped (exit status %s)", self.name, proc.returncode)


def _running(p: Any) -> bool:
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def main(argv: list[str]) -> None:
    """The guard: ``python -m krex_lab.launcher PARENT_PID MODULE [ARGS...]`` runs ``MODULE`` as
    ``__main__`` in this process, ended with SIGTERM when ``PARENT_PID`` dies."""
    if len(argv) < 2:
        sys.exit("usage: python -m krex_lab.launcher PARENT_PID MODULE [ARGS...]")
    parent, module, args = int(argv[0]), argv[1], argv[2:]
    _ended_with_parent(parent)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
