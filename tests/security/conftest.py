"""The ``bob`` fixture: a real unprivileged user made with ``useradd`` and removed with
``userdel`` afterwards (tests using it skip unless run as root on a machine with ``useradd``)."""

from __future__ import annotations

import pwd
import secrets
import subprocess
from collections.abc import Iterator

import pytest

from .users import User, needs_root_and_useradd


@pytest.fixture
def bob() -> Iterator[User]:
    needs_root_and_useradd()
    name = f"krexbob{secrets.token_hex(3)}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True, capture_output=True
    )
    try:
        entry = pwd.getpwnam(name)
        yield User(name, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)
