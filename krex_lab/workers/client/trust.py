"""Who serves a pool endpoint: what the kernel says, never what the pool says about itself.

A pool runs whatever it is sent as its own user, and what it sends back (a pickled return value
or exception) is unpickled by the client. So before a :class:`~.pool_client.PoolClient` sends
anything (a ping included) it asks the kernel who listens at an ``ipc://`` endpoint
(:func:`verify_ipc_endpoint`):

* every directory above the socket must be one that only this user or root can change (owned by
  this user or root; writable by group or others only with the sticky bit, and then the entry
  below it must be this user's or root's), so that the path cannot be swapped between this check
  and ZeroMQ's connect; symlinks are followed and the directories they lead to are checked too;
* the socket file itself must be a socket owned by this user (``lstat``);
* a plain ``AF_UNIX`` stream connection to it gives the listener's credentials (``SO_PEERCRED``
  of a listening socket: the process that called ``listen``); its uid must be this process's
  effective uid, and the path must still name the same inode afterwards.

The probe connection sends no byte: a foreign listener learns only that someone connected.
:func:`peer_uid_of_ipc` is the kernel part alone (usable for any UNIX-socket server).

``tcp://`` has no kernel identity: it is refused unless explicitly allowed (``allow_tcp=True``
or ``KREX_POOL_ALLOW_TCP=1``), as the pool refuses to serve it unless ``Pool.allow_tcp``.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat

import msgspec

from ...errors import PoolUnavailable
from ...peercred import listener_credentials

#: set to 1 to let a client talk to a pool over tcp (anyone who can reach it could be that "pool")
ALLOW_TCP_ENV = "KREX_POOL_ALLOW_TCP"


def untrusted(message: str) -> PoolUnavailable:
    """The error for an endpoint that another user serves, or could swap: a :class:`PoolUnavailable`
    (the class every caller already handles) marked so that no pool is started there on demand."""
    exc = PoolUnavailable(message)
    setattr(exc, "untrusted", True)  # noqa: B010 -- an instance mark, not an attribute of the class
    return exc


def is_untrusted(exc: BaseException) -> bool:
    """The error says another user serves (or could swap) the endpoint (see :func:`untrusted`)."""
    return bool(getattr(exc, "untrusted", False))


class PoolPeer(msgspec.Struct, frozen=True):
    """The listener of a verified ipc endpoint, as the kernel described it."""

    pid: int
    uid: int
    gid: int
    #: True when the path's safety rests on a sticky directory: once that socket is gone, another
    #: user may bind the same path, so a ZeroMQ socket must not reconnect to it on its own
    shared_dir: bool


def _owner(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def peer_uid_of_ipc(path: str) -> int:
    """The uid of the process listening on the UNIX stream socket ``path`` (``SO_PEERCRED``).

    Connects without sending anything. Raises ``FileNotFoundError`` / ``ConnectionRefusedError``
    (an ``OSError``) when nobody listens there."""
    return peer_credentials_of_ipc(path)[1]


def peer_credentials_of_ipc(path: str) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process listening on the UNIX stream socket ``path``."""
    return listener_credentials(path)


def _stable_entry(directory: str, entry_uid: int, euid: int) -> str | None:
    """Why the entry (owned by ``entry_uid``) in ``directory`` could be replaced by someone else; None if not."""
    try:
        st = os.lstat(directory)
    except OSError as exc:
        return f"{directory}: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{directory} is not a directory"
    if st.st_uid not in (euid, 0):
        return f"{directory} belongs to {_owner(st.st_uid)}"
    if st.st_mode & 0o022:
        if not st.st_mode & stat.S_ISVTX:
            return f"{directory} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}, not sticky)"
        if entry_uid not in (euid, 0):
            return f"an entry of the shared directory {directory} belongs to {_owner(entry_uid)}"
    return None


def _path_problems(path: str, euid: int, seen: set[str] | None = None) -> list[str]:
    """Reasons another user could swap ``path``: each entry from ``path`` up to ``/`` must be stable
    in its directory (:func:`_stable_entry`); a symlink's target is checked the same way."""
    seen = set() if seen is None else seen
    problems: list[str] = []
    current = os.path.abspath(path)
    while True:
        parent = os.path.dirname(current)
        if parent == current:
            break
        try:
            st = os.lstat(current)
        except OSError as exc:
            problems.append(f"{current}: {exc.strerror}")
            break
        why = _stable_entry(parent, st.st_uid, euid)
        if why:
            problems.append(why)
        if stat.S_ISLNK(st.st_mode) and current not in seen:
            seen.add(current)
            target = os.path.realpath(os.path.join(parent, os.readlink(current)))
            problems.extend(_path_problems(target, euid, seen))
        current = parent
    return problems


def verify_ipc_endpoint(path: str) -> PoolPeer:
    """The listener of the ipc socket ``path``, if it is this user's and the path is safe.

    Raises :class:`PoolUnavailable`: marked :func:`untrusted` when another user serves it or could
    swap the path; unmarked when nobody listens there (a pool may be started)."""
    euid = os.geteuid()
    path = os.path.abspath(path)
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        raise PoolUnavailable(f"no pool socket at {path}") from None
    except OSError as exc:
        raise PoolUnavailable(f"the pool socket {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(before.st_mode):
        raise untrusted(f"{path} is not a socket (it belongs to {_owner(before.st_uid)}): nothing was sent to it")
    if before.st_uid != euid:
        raise untrusted(
            f"the pool socket {path} belongs to {_owner(before.st_uid)}, not to you "
            f"({_owner(euid)}): nothing was sent to it"
        )
    problems = _path_problems(path, euid)
    if problems:
        raise untrusted(
            f"the pool socket {path} lies where another user could replace it ("
            f"{'; '.join(problems)}): nothing was sent to it"
        )
    try:
        pid, uid, gid = peer_credentials_of_ipc(path)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ECONNREFUSED):
            raise PoolUnavailable(f"no pool listens at {path}") from None
        raise PoolUnavailable(f"the pool socket {path}: {exc.strerror or exc}") from None
    if uid != euid:
        raise untrusted(
            f"the pool at {path} is served by {_owner(uid)} (pid {pid}), not by you "
            f"({_owner(euid)}): nothing was sent to it"
        )
    try:
        after = os.lstat(path)
    except OSError:
        raise PoolUnavailable(f"the pool socket {path} went away") from None
    if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
        raise untrusted(f"the pool socket {path} was replaced while it was checked: nothing was sent to it")
    shared = bool(os.stat(os.path.dirname(path)).st_mode & 0o022)
    return PoolPeer(pid=pid, uid=uid, gid=gid, shared_dir=shared)


def tcp_allowed(allow_tcp: bool | None) -> bool:
    """Whether a tcp endpoint may be used: ``allow_tcp`` if given, else ``$KREX_POOL_ALLOW_TCP``."""
    if allow_tcp is not None:
        return allow_tcp
    return os.environ.get(ALLOW_TCP_ENV, "").strip().lower() in ("1", "true", "yes")
