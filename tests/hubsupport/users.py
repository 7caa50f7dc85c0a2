"""Real Unix users for the hub test: ``useradd`` with a home of their own under a root-owned
temporary directory and a password (PAM, JupyterHub's default authenticator, checks it at the
login form), in a Unix group where asked; ``userdel`` after (home and KREX runtime dir removed);
and views of their processes."""

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

from tests.support.leftovers import files_of, remove_files_of


@dataclass
class HubUser:
    name: str
    uid: int
    gid: int
    home: Path
    #: the login form's password (set with chpasswd)
    password: str = ""


def can_make_users() -> str | None:
    """Why users cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root: the hub spawns servers as real users and the arbiter is root's"
    for tool in ("useradd", "userdel", "groupadd", "groupdel", "chpasswd"):
        if shutil.which(tool) is None:
            return f"needs {tool} to make real users"
    if not os.path.exists("/etc/pam.d/login"):
        return "needs PAM's login service (/etc/pam.d/login): the hub's default authenticator checks passwords with it"
    return None


@contextlib.contextmanager
def make_users(base: Path, *prefixes: str, group: str = "", members: int = 0) -> Iterator[list[HubUser]]:
    """One user per prefix (``<prefix><6 hex>``), home ``base/<name>`` (mode 0700, theirs), with a
    password; the first ``members`` of them in the Unix group ``group`` (made here, where given).
    At exit every process of theirs is killed (continued first), then ``userdel`` (and ``groupdel``)."""
    made: list[HubUser] = []
    before: dict[int, set[str]] = {}  # what each uid owned in /tmp when made (a deleted user's uid comes back)
    try:
        if group:
            subprocess.run(["groupadd", group], check=True, capture_output=True)
        for i, prefix in enumerate(prefixes):
            name = f"{prefix}{secrets.token_hex(3)}"
            home = base / name
            extra = ["--groups", group] if group and i < members else []
            subprocess.run(
                ["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/sh", *extra, name],
                check=True,
                capture_output=True,
            )
            entry = pwd.getpwnam(name)
            password = secrets.token_urlsafe(12)
            subprocess.run(["chpasswd"], input=f"{name}:{password}\n", text=True, check=True, capture_output=True)
            made.append(HubUser(name, entry.pw_uid, entry.pw_gid, home, password))
            before[entry.pw_uid] = files_of(entry.pw_uid)
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
            remove_files_of(u.uid, keep=before.get(u.uid, set()))  # their KREX runtime dir and the like
        if group:
            subprocess.run(["groupdel", group], check=False, capture_output=True)


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
