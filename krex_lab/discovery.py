"""Which arbiter a client uses when none is named: the one this user's lab uses.

A ``krex`` command in a terminal beside a running ``krex lab`` must reach the arbiter the lab's
kernels use, whichever that is: the node's root arbiter the lab joined, an embedded arbiter the
lab started (in a private runtime dir when another arbiter held the usual one), or this user's
own. So :func:`default_endpoint` (every client's default) looks,
in this order, for:

1. ``KREX_ENDPOINT``, when set: named explicitly, never second-guessed;
2. the arbiter of a running lab of this user: each lab leaves a record, ``lab-<pid>.json`` in
   this user's own runtime dir (:func:`write_lab_record`), naming the endpoint it uses; the
   newest whose lab is alive and whose socket is listened to wins. Without ``KREX_RUNTIME_DIR``
   the other default runtime dirs of the user are read too (:func:`record_dirs`): a lab started
   in a login session (``$XDG_RUNTIME_DIR/krex``) is found from an ``su`` shell (a dir in
   ``/tmp``), and the other way round;
3. the node's arbiter (``KREX_NODE_ENDPOINT``, default ``ipc:///run/krex/arbiter.sock``; empty:
   never), when root (or this user) listens there: what the lab itself tries first;
4. the socket in this user's runtime dir (``KREX_RUNTIME_DIR``, else the default one).

Only what this user may trust is taken: a record that is this user's own regular file, and a
socket whose listener is root or this user (:class:`krex_lab.connection.Connection` checks the
listener again before it sends anything). A lab started with another ``XDG_RUNTIME_DIR`` than
the terminal's is found as long as neither names ``KREX_RUNTIME_DIR`` (the lab's log names its
endpoint for ``KREX_ENDPOINT`` otherwise).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from . import paths
from .errors import KrexError

#: the node arbiter's endpoint: a root arbiter's runtime dir is /run/krex
NODE_ENDPOINT = "ipc:///run/krex/arbiter.sock"
#: overrides :data:`NODE_ENDPOINT` (``KrexExtensionApp.node_endpoint`` wins over both in a lab)
NODE_ENDPOINT_ENV = "KREX_NODE_ENDPOINT"
_RECORD_PREFIX = "lab-"


def node_endpoint() -> str:
    """The node arbiter's endpoint (``KREX_NODE_ENDPOINT``, else :data:`NODE_ENDPOINT`; "" none)."""
    return os.environ.get(NODE_ENDPOINT_ENV, NODE_ENDPOINT)


def own_endpoint() -> str:
    """The socket in this user's runtime dir (``KREX_RUNTIME_DIR`` when set)."""
    return f"ipc://{paths.runtime_dir() / 'arbiter.sock'}"


def default_endpoint() -> str:
    """The arbiter a client uses when none is named (see the module's docstring for the order)."""
    explicit = os.environ.get(paths.ENDPOINT_ENV)
    if explicit:
        return explicit
    record = next(lab_records(), None)
    if record is not None:
        return str(record["endpoint"])
    node = node_endpoint()
    if node and listened(node):
        return node
    return own_endpoint()


def listened(endpoint: str) -> bool:
    """Root or this user listens at the ``ipc://`` ``endpoint`` (a connect, nothing sent); a
    ``tcp://`` one is taken as it is named."""
    if not endpoint.startswith("ipc://"):
        return endpoint.startswith("tcp://")
    from .peercred import listener_credentials

    try:
        return listener_credentials(endpoint[len("ipc://") :], timeout=0.5)[1] in (0, os.geteuid())
    except OSError:
        return False


def record_dirs() -> list[Path]:
    """Where this user's running labs may have left their records: this user's runtime dir and,
    unless ``KREX_RUNTIME_DIR`` names one, the user's other defaults (a session with another
    ``XDG_RUNTIME_DIR``, or none). Root's is ``/run/krex`` in every session."""
    try:  # looked in, not made: a command that only reads (krex status, krex history) makes no dir
        dirs = [paths.own_runtime_dir(create=False)]
    except (OSError, KrexError):  # an unusable runtime dir: the client's own request says why
        dirs = []
    if os.geteuid() != 0 and not os.environ.get(paths.RUNTIME_DIR_ENV):
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        dirs += [Path(p) / "krex" for p in (xdg, f"/run/user/{os.geteuid()}") if p]
        dirs += paths._own_tmp_dirs()
    return list(dict.fromkeys(dirs))


def write_lab_record(directory: Path, endpoint: str, kind: str) -> Path:
    """Say that this process (a lab) uses the arbiter at ``endpoint``; returns the record's path
    (the lab removes it at its stop; a record of a dead lab is passed over, and removed)."""
    path = directory / f"{_RECORD_PREFIX}{os.getpid()}.json"
    tmp = directory / f".{path.name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"pid": os.getpid(), "endpoint": endpoint, "kind": kind}, f)
    os.replace(tmp, path)  # a reader sees the old record or the new one, never half of one
    return path


def lab_records() -> Iterator[dict[str, object]]:
    """The records of this user's running labs whose arbiter is listened to, newest first (each
    arbiter asked only as the records are read: the first one found is usually all a caller needs)."""
    entries: list[os.DirEntry[str]] = []
    for where in record_dirs():
        try:
            entries += [e for e in os.scandir(where) if e.name.startswith(_RECORD_PREFIX) and e.name.endswith(".json")]
        except OSError:
            continue
    found: list[tuple[float, dict[str, object]]] = []
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                continue
            record = json.loads(Path(entry.path).read_text())
            pid, _ = int(record["pid"]), str(record["endpoint"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not _alive(pid):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)  # its lab was killed before it could remove it
            continue
        found.append((st.st_mtime, record))
    for _, record in sorted(found, key=lambda item: -item[0]):
        if listened(str(record["endpoint"])):
            yield record


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
