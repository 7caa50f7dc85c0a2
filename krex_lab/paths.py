"""Where KREX keeps its sockets, journal and lock files, and how it opens them safely.

One runtime directory per arbiter. Single-user: ``$XDG_RUNTIME_DIR/krex``, mode 0700, so only
its owner can reach the socket. Without ``XDG_RUNTIME_DIR`` (a cron job, ``su``, a container),
a directory of the user's in ``/tmp`` whose name nobody can take first: ``/tmp/krex-<uid>-<random>``
made with ``mkdtemp`` (0700), found again by every process of the user by listing ``/tmp`` for
``krex-<uid>-*`` directories that are really the user's (a real directory, owned by the uid, 0700;
the first by name wins, so that two processes that made one each at once agree). Another user
can create such names but not own them: they are passed over, never refused. An older
``/tmp/krex-<uid>`` of the user's own is still used first. Root (a system, multi-user arbiter)
defaults to ``/run/krex``. ``KREX_RUNTIME_DIR`` points an arbiter (and its clients) elsewhere;
what only this user uses (the pool's socket and log) goes in :func:`own_runtime_dir`, never in
another user's (root's) runtime dir.

Root never trusts a path a user controls: :func:`prepare_runtime_dir` refuses a runtime dir
that is a symlink, is not a directory, belongs to someone else, is writable by group or
others, or (for root) lies below a directory that a non-root user could swap; every file in
it is opened with ``O_NOFOLLOW`` (:func:`open_private`).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .errors import KrexError

ENDPOINT_ENV = "KREX_ENDPOINT"
POOL_ENDPOINT_ENV = "KREX_POOL_ENDPOINT"
RUNTIME_DIR_ENV = "KREX_RUNTIME_DIR"
GPU_ENV = "KREX_GPU"
#: set (not "0"): KREX's informational lines (a region's wait, a pool started) are not printed
QUIET_ENV = "KREX_QUIET"


def quiet() -> bool:
    return os.environ.get(QUIET_ENV, "") not in ("", "0")


ROOT_RUNTIME_DIR = Path("/run/krex")


class UnsafePath(KrexError):
    """A path KREX would use is (or could be) controlled by another user."""


def runtime_dir(create: bool = True) -> Path:
    """The arbiter's runtime directory, created (mode 0700) and validated if ``create``.

    Root without ``KREX_RUNTIME_DIR`` gets ``/run/krex``; others ``$XDG_RUNTIME_DIR/krex``,
    else ``/tmp/krex-<uid>``. A directory that already exists must be a real directory (not a
    symlink) of the effective user, not writable by group or others (see
    :func:`prepare_runtime_dir`); a multi-user arbiter's directory (0755, root's) is accepted
    as it is, so that its users can name its socket.
    """
    explicit = os.environ.get(RUNTIME_DIR_ENV)
    if explicit:
        path = Path(explicit)
    elif os.geteuid() == 0:
        path = ROOT_RUNTIME_DIR
    else:
        path = _own_default(create)
    if not create:
        return path
    if explicit and os.geteuid() != 0:
        st = _lstat(path)
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022:
            return path  # a system arbiter's directory: its users only reach the socket there
    return prepare_runtime_dir(path, multi_user=False, chmod=False)


def own_runtime_dir(create: bool = True) -> Path:
    """This user's own runtime dir (created, 0700), whatever ``KREX_RUNTIME_DIR`` says: for what
    only this user uses (its pool's socket and log) when that names another user's (a system
    arbiter's) directory. ``create=False``: where it is or would be, nothing made (a reader)."""
    path = runtime_dir(create=create)
    st = _lstat(path)
    if st is not None and st.st_uid == os.geteuid():
        return path
    if not create:
        return _own_default(False)
    return prepare_runtime_dir(_own_default(True), multi_user=False, chmod=False)


def _own_default(create: bool) -> Path:
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.access(xdg, os.W_OK):
        return Path(xdg) / "krex"
    found = _own_tmp_dirs()
    if found or not create:
        return found[0] if found else Path(f"/tmp/krex-{os.geteuid()}")
    import tempfile  # only here: most users have XDG_RUNTIME_DIR

    tempfile.mkdtemp(prefix=f"krex-{os.geteuid()}-", dir="/tmp")
    return _own_tmp_dirs()[0]  # ours, or one made at the same moment by another process of ours


def _own_tmp_dirs() -> list[Path]:
    """The user's runtime dirs in /tmp: ``krex-<uid>`` first, then ``krex-<uid>-*`` by name; only
    real directories owned by the effective uid and closed to everyone else."""
    uid = os.geteuid()
    legacy, prefix = f"krex-{uid}", f"krex-{uid}-"
    found = []
    try:
        with os.scandir("/tmp") as entries:
            for entry in entries:
                if entry.name != legacy and not entry.name.startswith(prefix):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077:
                    found.append(entry.name)
    except OSError:
        return []
    return [Path("/tmp", n) for n in sorted(found, key=lambda n: (n != legacy, n))]


def prepare_runtime_dir(path: Path, *, multi_user: bool, chmod: bool = True) -> Path:
    """Create or validate an arbiter's runtime directory; returns the path to use from now on.

    Created if missing (mode 0700, or 0755 for a multi-user arbiter so that other users can
    reach its socket), never following a symlink at the last component. Refused
    (:class:`UnsafePath`, saying why and how to fix it) when it is a symlink, not a
    directory, not owned by the effective uid, or writable by group or others; for root also
    when a directory above it is owned by a non-root user or writable by one without the
    sticky bit (a user could swap the path under root). Symlinks above the last component
    are resolved first, and the resolved path is what is checked and returned.
    """
    path = Path(os.path.abspath(path))
    if path.parent != path:
        parent = Path(os.path.realpath(path.parent))
        path = parent / path.name
    euid = os.geteuid()
    if euid == 0:
        _check_ancestors(path)
    path.parent.mkdir(mode=0o755 if multi_user else 0o700, parents=True, exist_ok=True)
    if euid == 0:
        _check_ancestors(path)  # what mkdir made is root's; what was there may not be
    mode = 0o755 if multi_user else 0o700
    created = False
    try:
        os.mkdir(path, 0o700)  # mkdir never follows a symlink at its last component
        created = True
    except FileExistsError:
        pass
    fd = _open_dir(path)
    try:
        st = os.fstat(fd)
        if not created:
            _check_owned_dir(path, st, "runtime directory")
        if (chmod or created) and stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return path


def check_private_dir(path: Path) -> None:
    """Refuse (:class:`UnsafePath`) a directory that another user could have written: what
    the guardian and the supervisor check before they replay a journal from it."""
    path = Path(os.path.abspath(path))
    if path.parent != path:
        path = Path(os.path.realpath(path.parent)) / path.name
    if os.geteuid() == 0:
        _check_ancestors(path)
    fd = _open_dir(path)
    try:
        _check_owned_dir(path, os.fstat(fd), "runtime directory")
    finally:
        os.close(fd)


def open_private(path: Path, flags: int, mode: int = 0o600) -> int:
    """Open a file of a runtime directory without following a symlink; returns the fd.

    Refuses (:class:`UnsafePath`) a symlink, anything but a regular file, a file of another
    user and one with several hard links (each could point root at a file a user chose). A
    file KREX creates gets ``mode``; an existing one of ours with more permissions than
    ``mode`` is narrowed to it, so a root arbiter's journal is never world-readable.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(
                f"{path} is a symlink: KREX never follows one in its runtime directory; "
                f"remove it (and check who planted it)"
            ) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{path} is not a regular file: remove it")
        if st.st_uid != os.geteuid():
            raise UnsafePath(
                f"{path} belongs to uid {st.st_uid}, not to uid {os.geteuid()}: remove it (and check who planted it)"
            )
        if st.st_nlink > 1:
            raise UnsafePath(f"{path} has {st.st_nlink} hard links: another name points at the same file; remove it")
        if stat.S_IMODE(st.st_mode) & ~mode:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def events_endpoint(endpoint: str) -> str:
    """The PUB endpoint that goes with a ROUTER endpoint (``.sock`` -> ``-events.sock``, port + 1)."""
    if endpoint.startswith("ipc://"):
        base = endpoint[len("ipc://") :]
        stem = base[:-5] if base.endswith(".sock") else base
        return f"ipc://{stem}-events.sock"
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint[len("tcp://") :].rpartition(":")
        return f"tcp://{host}:{int(port) + 1}"
    raise ValueError(f"unsupported endpoint {endpoint!r}: use ipc://PATH or tcp://HOST:PORT")


# -- helpers -------------------------------------------------------------------------------
def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _open_dir(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        st = _lstat(path)
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise UnsafePath(
                f"{path} is a symlink (to {os.readlink(path)!r}): KREX never follows one there; "
                f"remove it, or set {RUNTIME_DIR_ENV} to a directory of your own"
            ) from None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise UnsafePath(
                f"{path} is not a directory: remove it, or set {RUNTIME_DIR_ENV} to another path"
            ) from None
        raise UnsafePath(f"cannot open {path}: {exc.strerror}") from None


def _check_owned_dir(path: Path, st: os.stat_result, what: str) -> None:
    euid = os.geteuid()
    if st.st_uid != euid:
        raise UnsafePath(
            f"{what} {path} belongs to uid {st.st_uid}, not to uid {euid} (someone else made "
            f"it first): remove it, or set {RUNTIME_DIR_ENV} to a directory of your own"
        )
    if st.st_mode & 0o022:
        raise UnsafePath(
            f"{what} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}): "
            f"anyone could plant files there; remove it and let KREX create it, or "
            f"chmod go-w it after checking its contents"
        )


def _check_ancestors(path: Path) -> None:
    """For root: every directory above ``path`` is root's and writable by no other user, unless
    sticky (then others cannot rename or remove root's entries in it)."""
    for parent in path.parents:
        st = _lstat(parent)
        if st is None:
            continue  # made by root below, with mkdir's mode
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePath(f"{parent} (above {path}) is a symlink that changed while it was checked; retry")
        if st.st_uid != 0:
            raise UnsafePath(
                f"{parent} belongs to uid {st.st_uid}: that user could swap {path} under root; "
                f"use a runtime directory under root's own directories (default {ROOT_RUNTIME_DIR})"
            )
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX and not _only_root_group(st):
            raise UnsafePath(
                f"{parent} is writable by others (mode {stat.S_IMODE(st.st_mode):o}, no sticky bit): "
                f"any user could swap {path} under root; use a runtime directory under root's own "
                f"directories (default {ROOT_RUNTIME_DIR})"
            )


def _only_root_group(st: os.stat_result) -> bool:
    """Group-writable (not other-writable) by group 0 when that group has no other member."""
    if st.st_mode & 0o002 or st.st_gid != 0:
        return False
    import grp

    try:
        return not [m for m in grp.getgrgid(0).gr_mem if m != "root"]
    except KeyError:
        return False
