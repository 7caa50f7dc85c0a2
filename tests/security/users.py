"""Real unprivileged users for the hostile-neighbour tests (made with ``useradd``, removed with
``userdel``): :class:`User` runs commands as one; :func:`needs_root_and_useradd` skips otherwise."""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.leftovers import files_of, remove_files_of

REPO = Path(__file__).resolve().parents[2]


@dataclass
class User:
    name: str
    uid: int
    gid: int

    def python(
        self, code: str, *args: str, check: bool = True, env_extra: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Python as this user: the test's interpreter if the user may run it, else the system's
        (``krex_lab.paths`` needs only the standard library)."""
        for exe in (sys.executable, "/usr/bin/python3"):
            if self.run(exe, "-c", "import krex_lab.paths", check=False).returncode == 0:
                return self.run(exe, "-c", code, *args, check=check, env_extra=env_extra)
        pytest.skip(f"no Python that {self.name} may run imports krex_lab")

    def run(
        self, *argv: str, check: bool = True, env_extra: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a command as this user (real setuid, no supplementary groups), in /."""
        env = {"PATH": "/usr/bin:/bin", "HOME": "/", "PYTHONPATH": str(REPO), "LC_ALL": "C.UTF-8", **(env_extra or {})}
        try:
            return subprocess.run(
                list(argv),
                user=self.uid,
                group=self.gid,
                extra_groups=[],
                cwd="/",
                env=env,
                capture_output=True,
                text=True,
                check=check,
                timeout=60,
            )
        except PermissionError as exc:  # the interpreter itself is out of the user's reach
            return subprocess.CompletedProcess(list(argv), 126, "", str(exc))


def needs_root_and_useradd() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the tests play a root arbiter against a real unprivileged user")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("needs useradd/userdel to make a real unprivileged user")


@contextlib.contextmanager
def make_user(prefix: str = "krexbob") -> Iterator[User]:
    """A real unprivileged user for the length of a test: ``useradd``, then ``userdel``."""
    needs_root_and_useradd()
    name = f"{prefix}{secrets.token_hex(3)}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True, capture_output=True
    )
    entry = pwd.getpwnam(name)
    before = files_of(entry.pw_uid)
    try:
        yield User(name, entry.pw_uid, entry.pw_gid)
    finally:
        remove_files_of(entry.pw_uid, keep=before)  # its runtime dir, a script dir made its own
        subprocess.run(["userdel", name], check=False, capture_output=True)


def as_user(
    user: User, fn: Callable[[], int], env: dict[str, str] | None = None, timeout: float = 20
) -> tuple[int, str, str]:
    """``fn()`` in a forked child that became ``user`` (setgroups, setgid, setuid): its exit code,
    stdout and stderr. Forked, not exec'd: the interpreter and every module the client needs are
    loaded already (the user may not be able to read the test's virtualenv)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (pytest's capture is not fd 1)
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            os.setgroups([])
            os.setgid(user.gid)
            os.setuid(user.uid)
            os.chdir("/")
            os.environ.update(env or {})
            code = fn()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:
            print(f"{type(exc).__name__}: {exc}", flush=True)
            code = 71
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(out_w)
    os.close(err_w)
    chunks: dict[int, bytes] = {out_r: b"", err_r: b""}
    deadline = time.monotonic() + timeout
    open_fds = [out_r, err_r]
    while open_fds and time.monotonic() < deadline:
        ready, _, _ = select.select(open_fds, [], [], 0.1)
        for fd in ready:
            data = os.read(fd, 65536)
            if data:
                chunks[fd] += data
            else:
                open_fds.remove(fd)
    if open_fds:  # the old client waited for a reply that never came
        os.kill(pid, 9)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    os.close(out_r)
    os.close(err_r)
    return code, chunks[out_r].decode(errors="replace"), chunks[err_r].decode(errors="replace")
