"""Real Unix users for the hub test: ``useradd`` with a home of their own under a root-owned
temporary directory, ``userdel`` after (home removed); and views of their processes."""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass
class HubUser:
    name: str
    uid: int
    gid: int
    home: Path


def can_make_users() -> str | None:
    """Why users cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root: the hub spawns servers as real users and the arbiter is root's"
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        return "needs useradd/userdel to make real users"
    return None


@contextlib.contextmanager
def make_users(base: Path, *prefixes: str) -> Iterator[list[HubUser]]:
    """One user per prefix (``<prefix><6 hex>``), home ``base/<name>`` (mode 0700, theirs).
    At exit every process of theirs is killed (continued first), then ``userdel``."""
    made: list[HubUser] = []
    try:
        for prefix in prefixes:
            name = f"{prefix}{secrets.token_hex(3)}"
            home = base / name
            subprocess.run(
                ["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/sh", name],
                check=True,
                capture_output=True,
            )
            entry = pwd.getpwnam(name)
            made.append(HubUser(name, entry.pw_uid, entry.pw_gid, home))
            os.chmod(home, 0o700)
        yield made
    finally:
        uids = {u.uid for u in made}
        for p in processes_of(uids):
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGCONT)
                p.kill()
        for u in made:
            subprocess.run(["userdel", "--force", "--remove", u.name], check=False, capture_output=True)
            shutil.rmtree(u.home, ignore_errors=True)


def processes_of(uids: set[int]) -> list[psutil.Process]:
    """Live (non-zombie) processes whose real or effective uid is one of ``uids``."""
    found = []
    for p in psutil.process_iter(["uids", "status"]):
        with contextlib.suppress(psutil.Error):
            ids = p.info["uids"]
            if (ids.real in uids or ids.effective in uids) and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p)
    return found


def describe(procs: list[psutil.Process]) -> str:
    out = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            out.append(f"{p.pid} {p.username()} {p.status()} {' '.join(p.cmdline())[:160]}")
    return "\n".join(out)


def kernel_process(uid: int, kernel_id: str) -> psutil.Process | None:
    """The ipykernel process of ``kernel_id`` (its connection file is named after the id), owned by ``uid``."""
    for p in processes_of({uid}):
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(p.cmdline())
            if "ipykernel_launcher" in cmd and f"kernel-{kernel_id}.json" in cmd:
                return p
    return None
