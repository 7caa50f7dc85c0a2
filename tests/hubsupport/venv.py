"""The deployment's virtualenv, as docs/jupyterhub.md makes it (``/opt/krex``): the system Python,
``krex-lab[hub]`` installed editable from this checkout, and the JupyterHub version of the test's
own interpreter. The hub, its services and the users' servers and kernels all run from it.

The test's own interpreter may live where a user cannot reach it (``/root/.pyenv``), so the users'
servers and kernels run from this venv instead. It is built once (about 30 s) under
``/opt/krex-hub-test/``, root-owned and world-readable, keyed by the hash of ``pyproject.toml``,
the checkout's path (the editable install points there) and the JupyterHub version; reruns reuse it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

CACHE = Path(os.environ.get("KREX_HUB_TEST_VENV_CACHE", "/opt/krex-hub-test"))
BASE_PYTHON = "/usr/bin/python3"
#: what the docs install: krex-lab's hub extra (JupyterHub, JupyterLab, the admin page's charts)
EXTRAS = "hub"


class VenvUnavailable(Exception):
    """Why the users' venv could not be made (the test skips, saying so)."""


def _key(root: Path, requirements: list[str]) -> str:
    h = hashlib.sha256()
    h.update((root / "pyproject.toml").read_bytes())
    h.update(str(root.resolve()).encode())
    h.update(" ".join(requirements).encode())
    return h.hexdigest()[:16]


def unreadable_for_others(root: Path) -> list[str]:
    """Paths of the checkout a user could not read (an editable install needs every one)."""
    bad = []
    p = root.resolve()
    for parent in [p, *p.parents]:
        if not os.stat(parent).st_mode & 0o001:
            bad.append(str(parent))
    for dirpath, dirnames, filenames in os.walk(root / "krex_lab"):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        if os.stat(dirpath).st_mode & 0o005 != 0o005:
            bad.append(dirpath)
        bad.extend(
            os.path.join(dirpath, f)
            for f in filenames
            if f.endswith(".py") and not os.stat(os.path.join(dirpath, f)).st_mode & 0o004
        )
    return bad


def user_venv(root: Path, hub_version: str) -> Path:
    """The venv's directory (built if missing); raises :class:`VenvUnavailable` saying why not."""
    return build_venv(root, [f"{root}[{EXTRAS}]", f"jupyterhub=={hub_version}"], CACHE)


def build_venv(root: Path, requirements: list[str], cache: Path) -> Path:
    """A venv of the system Python under ``cache`` with ``requirements`` (the checkout's among them
    installed editable), root's and world-readable; built once per key, earlier keys removed."""
    if not os.access(BASE_PYTHON, os.X_OK):
        raise VenvUnavailable(f"no {BASE_PYTHON} to build a venv the test users can run")
    bad = unreadable_for_others(root)
    if bad:
        raise VenvUnavailable(f"the checkout is not readable by other users (editable install): {bad[:5]}")
    cache.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(cache, 0o755)
    venv = cache / f"venv-{_key(root, requirements)}"
    done = venv / ".krex-complete"
    with open(cache / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        steps = [
            [BASE_PYTHON, "-m", "venv", str(venv)],
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                *(x for r in requirements for x in (["-e", r] if r.startswith(str(root)) else [r])),
            ],
        ]
        for cmd in steps:
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, umask=0o022)
            except (OSError, subprocess.TimeoutExpired) as exc:
                shutil.rmtree(venv, ignore_errors=True)
                raise VenvUnavailable(f"{' '.join(cmd[:4])} failed: {exc}") from None
            if r.returncode != 0:
                shutil.rmtree(venv, ignore_errors=True)
                raise VenvUnavailable(f"{' '.join(cmd[:6])} failed ({r.returncode}): {(r.stdout + r.stderr)[-1500:]}")
        subprocess.run(["chmod", "-R", "go+rX,go-w", str(venv)], check=True)
        for old in cache.glob("venv-*"):  # earlier keys: a changed pyproject.toml
            if old != venv:
                shutil.rmtree(old, ignore_errors=True)
        done.touch()
    return venv
