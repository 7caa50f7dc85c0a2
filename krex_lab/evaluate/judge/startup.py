"""Code that ran in the judge's interpreter before the judge: ``sitecustomize`` and
``usercustomize``, which ``site`` imports at every start from the first directory of the import
path that has one. A candidate may plant one (in ``$PYTHONPATH``, the user site directory or a
writable ``site-packages``) to patch the next interpreter's clock and comparators; a judge that
ran one decides nothing.

A distribution's own file is not such a plant: Debian's Python ships a ``sitecustomize`` in the
standard library's directory (a link into ``/etc/python3.X``). Whoever can write there can also
rewrite the standard library the judge imports, so a file found there, root's and writable by no
one else at every step of its links, is trusted as much as the rest of the interpreter.
"""

from __future__ import annotations

import os
import stat
import sys
import sysconfig

__all__ = ["planted_startup_code", "root_only"]


def planted_startup_code() -> str | None:
    """The startup module this interpreter ran that the judge cannot trust, as ``"name (file)"``
    (None: none ran, or only the distribution's own)."""
    stdlib = {os.path.realpath(sysconfig.get_path(k)) for k in ("stdlib", "platstdlib")}
    for name in ("sitecustomize", "usercustomize"):
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None) if module is not None else None
        if not path:
            continue
        if os.path.realpath(os.path.dirname(os.path.abspath(path))) in stdlib and root_only(path):
            continue
        return f"{name} ({path})"
    return None


def root_only(path: str) -> bool:
    """Whether only root can change what ``path`` names: the file and every directory above it
    are root's and writable by no group or other, at each link of the way to the real file."""
    path = os.path.abspath(path)
    for _ in range(40):  # more links than that: a loop
        if not all(_roots(step) for step in [path, *_parents(path)]):
            return False
        if not os.path.islink(path):
            # the directories that links above it lead to, too
            real = os.path.realpath(path)
            return all(_roots(step) for step in [real, *_parents(real)])
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
    return False


def _roots(step: str) -> bool:
    """Root's, and (a link's own bits mean nothing) writable by no group or other."""
    try:
        st = os.lstat(step)
    except OSError:
        return False
    if st.st_uid != 0:
        return False
    return stat.S_ISLNK(st.st_mode) or not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _parents(path: str) -> list[str]:
    out: list[str] = []
    while True:
        parent = os.path.dirname(path)
        if parent == path:
            return out
        out.append(parent)
        path = parent
