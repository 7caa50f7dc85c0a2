"""Starting this user's pool on demand, for a client that finds none answering.

The pool starts detached (a session of its own, output appended to ``pool.log`` beside its
socket) and exits after its idle time. Two clients may start one each at once: one pool takes
the endpoint's lock and the other exits (a pool started on demand steps aside), so a client
waits for whichever answers, and starts another only where the one it started lost that race
to a pool that has since exited.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ... import paths
from ...errors import PoolUnavailable
from ..endpoint import ipc_path, lock_path
from ..wire import PoolInfo

if TYPE_CHECKING:
    import subprocess

__all__ = ["START_TIMEOUT", "lock_free", "start_pool", "started_line"]

#: how long a client waits for a pool it started to answer
START_TIMEOUT = 60.0


def lock_free(endpoint: str) -> bool:
    """True when no pool holds the endpoint's lock (so pinging would only wait)."""
    path = lock_path(endpoint)
    if path is None:
        return False
    sock = ipc_path(endpoint)
    if sock is None or not os.path.exists(sock) or not os.path.exists(path):
        return True
    try:  # never follow a planted symlink, never block on a planted FIFO
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except OSError:  # BlockingIOError: a pool holds it
        return False
    finally:
        os.close(fd)


def start_pool(endpoint: str, answers: Callable[[], PoolInfo | None]) -> tuple[PoolInfo, int, Path]:
    """Start a detached pool serving ``endpoint`` and wait until ``answers()`` gives a pool's
    ``PoolInfo``: that, the pid of the pool this call started last, and its log."""
    from ... import launcher  # here only: a run on a pool that answers never pays for it

    sock = ipc_path(endpoint)
    log_dir = Path(sock).parent if sock else paths.own_runtime_dir()
    log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    cmd = launcher.command("krex_lab.workers.pool", "--on-demand", f"--endpoint={endpoint}")

    def spawn() -> subprocess.Popen[bytes]:
        return launcher.start(cmd, log_dir / "pool.log", new_session=True, cwd="/")

    proc = spawn()
    spawned = 1

    def alive() -> bool:
        nonlocal proc, spawned
        code = proc.poll()
        if code is not None and lock_free(endpoint):
            if code != 0:
                tail = _tail(log_dir / "pool.log")
                raise PoolUnavailable(f"the pool started on demand exited with code {code}:\n{tail}")
            if spawned < 5:  # it lost a race with a pool that has since exited: try again
                proc, spawned = spawn(), spawned + 1
        return True

    info = launcher.wait_until(answers, alive, START_TIMEOUT)
    if info is None:
        raise PoolUnavailable(
            f"the pool started on demand did not answer within {START_TIMEOUT:g} s (see {log_dir / 'pool.log'})"
        )
    return info, proc.pid, log_dir / "pool.log"


def started_line(pid: int, log: Path, idle: float) -> str:
    """What a client says once it started a pool: it runs in the background, how long it stays
    (``idle``: its idle exit in seconds, 0: it stays), how to stop it."""
    after = f"{idle / 60:g} idle minutes" if idle >= 120 else f"{idle:g} idle seconds"
    stays = f"exits after {after}" if idle > 0 else "stays"
    return (
        f"krex: started a pool of warm workers in the background (pid {pid}, log {log}) for this "
        f"and later runs; it {stays}, or stop it now with `kill {pid}`"
    )


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
