"""The candidate's build directory: its own for one evaluation, its compilers' cache kept.

Under the evaluator's cache (:mod:`..cache`), all of it the judge's but the first:

* ``builds/<hash>/``: the candidate's build directory (its working directory, temporary
  directory and tools' caches), the one place its sandbox lets it write. Emptied before each
  evaluation and removed after it: whatever the candidate wrote there, nothing of it is found by
  the next evaluation (a result it memoised, a module planted for the next import, a link or a
  pipe laid for the judge). Its path stays the same from one evaluation of a source to the next,
  so a compiler's build files, which name it, stay valid;
* ``builds/<hash>.kept/``: what the candidate's compilers made *while it loaded*, before it had
  seen any input (``load_inline``'s extension, Triton's, inductor's and numba's caches), copied
  once after a load that passed and copied back before the next evaluation of the same source:
  the same source is not compiled twice. Only the tools' cache directories are kept, only
  regular files, directories and links (never followed), at most :data:`KEEP_LIMIT` bytes;
* ``builds/<hash>.lock``: held by the judge whose evaluation uses the directory. An evaluation of
  the same source running at the same time gets a directory of its own (``builds/<hash>-<token>/``,
  the kept cache copied in) and removes it after;
* ``outputs/<job id>.txt``: the candidate's stdout and stderr, made by the judge (the sandbox lets
  the candidate write that file, never replace it), read by the caller, then removed.

No file under any of them is ever followed as a link by the judge or its caller.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import stat
import sys

__all__ = ["KEEP_LIMIT", "KEPT", "BuildDir", "wipe"]

#: the tools' caches a load fills (:func:`..candidate.sandbox._tool_dirs`, ``TORCH_EXTENSIONS_DIR``)
KEPT = ("torch_extensions", "triton", ".triton", "inductor", "cache", "nv-cache", "numba")
#: the most a kept cache may hold: a candidate that makes more is compiled again next time
KEEP_LIMIT = 2 << 30


class BuildDir:
    """One evaluation's build directory for the source of hash ``digest``."""

    def __init__(self, build_root: str, digest: str) -> None:
        self.root = build_root
        self.digest = digest
        self.stable = os.path.join(build_root, digest)
        self.kept = self.stable + ".kept"
        self.path = self.stable
        self._lock: int | None = None
        #: whether a kept cache was copied in
        self.restored = False
        #: the tools' caches as copied in (names, sizes, times): a load that left them so keeps
        #: nothing new
        self._restored_as: list[tuple[str, int, int]] | None = None

    def open(self) -> str:
        """The directory, empty but for the kept cache: the stable path when no other evaluation
        of this source holds it, else one of its own."""
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        fd = os.open(self.stable + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._lock, self.path = fd, self.stable
        except OSError:
            os.close(fd)
            self.path = f"{self.stable}-{secrets.token_hex(6)}"
        wipe(self.path)
        os.mkdir(self.path, 0o700)
        if os.path.isdir(self.kept):
            try:
                shutil.copytree(self.kept, self.path, symlinks=True, dirs_exist_ok=True)
                self.restored = True
                self._restored_as = _listing(self.path)
            except (OSError, shutil.Error):  # a cache being replaced meanwhile: compiled again
                pass
        return self.path

    def keep(self) -> None:
        """The tools' caches as the load left them, kept for the next evaluation of this source:
        once, and again only where a load changed them (a kept cache a newer compiler rebuilt)."""
        if self._lock is None:
            return
        if os.path.exists(self.kept) and self._restored_as is not None:
            try:
                if _listing(self.path) == self._restored_as:
                    return
            except OSError:
                return
        part = f"{self.kept}.part-{secrets.token_hex(6)}"
        top = -1
        try:
            top = os.open(self.path, _DIR)
            os.mkdir(part, 0o700)
            total = 0
            for name in KEPT:
                try:
                    fd = os.open(name, _DIR, dir_fd=top)
                except FileNotFoundError:
                    continue
                try:
                    total += _copy_tree(fd, os.path.join(part, name), KEEP_LIMIT - total)
                finally:
                    os.close(fd)
            old = f"{self.kept}.old-{secrets.token_hex(6)}"
            if os.path.lexists(self.kept):
                os.rename(self.kept, old)
            os.rename(part, self.kept)
            wipe(old)
        except (OSError, _TooLarge):
            wipe(part)
        finally:
            if top >= 0:
                os.close(top)

    def close(self) -> None:
        """The directory removed; the stable path let go."""
        wipe(self.path)
        if self._lock is not None:
            os.close(self._lock)  # the lock goes with its descriptor
            self._lock = None


class _TooLarge(Exception):
    pass


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _copy_tree(src: int, dst: str, budget: int) -> int:
    """The directory open as ``src`` copied to ``dst``: directories, regular files (times kept: a
    build tool compares them) and links as links; anything else (a pipe, a socket) left out.
    Bytes copied. Every name is opened relative to its directory's descriptor, never following a
    link: the candidate is alive while its cache is copied, and a directory it swaps for a link
    meanwhile makes the copy fail, never leads it outside."""
    os.mkdir(dst, 0o700)
    total = 0
    for name in os.listdir(src):
        d = os.path.join(dst, name)
        st = os.stat(name, dir_fd=src, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(name, dir_fd=src), d)
        elif stat.S_ISDIR(st.st_mode):
            fd = os.open(name, _DIR, dir_fd=src)
            try:
                total += _copy_tree(fd, d, budget - total)
            finally:
                os.close(fd)
        elif stat.S_ISREG(st.st_mode):
            total += st.st_size
            if total > budget:
                raise _TooLarge(name)
            _copy_file(src, name, d)
    return total


def _listing(path: str) -> list[tuple[str, int, int]]:
    """Every entry of the tools' caches under ``path``: (its path, size, time), links unfollowed;
    a directory by its name alone (a lock file made and removed in it changes its time)."""
    out: list[tuple[str, int, int]] = []
    for name in KEPT:
        top = os.path.join(path, name)
        if not _is_dir(top):
            continue
        for root, dirs, files in os.walk(top):
            out += [(os.path.relpath(os.path.join(root, n), path), 0, 0) for n in dirs]
            for n in files:
                st = os.lstat(os.path.join(root, n))
                out.append((os.path.relpath(os.path.join(root, n), path), st.st_size, st.st_mtime_ns))
    return sorted(out)


def _copy_file(src: int, name: str, dst: str) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return
        with open(fd, "rb", closefd=False) as f, open(dst, "xb") as g:
            shutil.copyfileobj(f, g, 1 << 20)
        os.chmod(dst, stat.S_IMODE(st.st_mode) & 0o700 | 0o600)
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.close(fd)


def wipe(path: str) -> None:
    """``path`` removed with everything in it, links never followed; directories the candidate
    made unreadable or unwritable (chmod) made the owner's again on the way."""

    def retry(func: object, p: str, exc: object) -> None:
        for d in (os.path.dirname(p), p):
            if _is_dir(d):  # a real directory (never a link's target)
                with contextlib.suppress(OSError):
                    os.chmod(d, 0o700)
        with contextlib.suppress(OSError):
            if _is_dir(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)

    if not os.path.lexists(path):
        return
    if not _is_dir(path):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    # onexc from Python 3.12 (onerror is deprecated there); the handler takes either
    handler = {"onexc" if sys.version_info >= (3, 12) else "onerror": retry}
    for _ in range(3):
        shutil.rmtree(path, **handler)  # type: ignore[arg-type]
        if not os.path.lexists(path):
            return
