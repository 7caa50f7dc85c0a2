"""Where KREX keeps its sockets, journal and lock files.

One runtime directory per arbiter. Single-user: ``$XDG_RUNTIME_DIR/krex`` (or
``/tmp/krex-<uid>``), mode 0700, so only its owner can reach the socket. A system arbiter is
pointed elsewhere with ``KREX_RUNTIME_DIR``.
"""

from __future__ import annotations

import os
from pathlib import Path

ENDPOINT_ENV = "KREX_ENDPOINT"
POOL_ENDPOINT_ENV = "KREX_POOL_ENDPOINT"
RUNTIME_DIR_ENV = "KREX_RUNTIME_DIR"
GPU_ENV = "KREX_GPU"


def runtime_dir(create: bool = True) -> Path:
    """The arbiter's runtime directory (created with mode 0700 if missing)."""
    explicit = os.environ.get(RUNTIME_DIR_ENV)
    if explicit:
        path = Path(explicit)
    else:
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        path = Path(xdg) / "krex" if xdg and os.access(xdg, os.W_OK) else Path(f"/tmp/krex-{os.getuid()}")
    if create:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
        # A directory someone else made for us would let them read our socket: refuse it.
        if st.st_uid != os.getuid() and os.getuid() != 0:
            raise PermissionError(f"{path} belongs to uid {st.st_uid}, not to you; set {RUNTIME_DIR_ENV}")
    return path


def default_endpoint() -> str:
    """``KREX_ENDPOINT`` when set, else the ipc socket in the runtime directory."""
    return os.environ.get(ENDPOINT_ENV) or f"ipc://{runtime_dir() / 'arbiter.sock'}"


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


def proof_dir(root: Path) -> Path:
    """Directory where clients prove their uid by creating a file (mode 1733: write, no listing)."""
    path = root / "proof"
    path.mkdir(exist_ok=True)
    os.chmod(path, 0o1733)
    return path
