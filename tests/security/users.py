"""Real unprivileged users for the hostile-neighbour tests (made with ``useradd``, removed with
``userdel``): :class:`User` runs commands as one; :func:`needs_root_and_useradd` skips otherwise."""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

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
    try:
        entry = pwd.getpwnam(name)
        yield User(name, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)
