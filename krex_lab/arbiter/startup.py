"""What an arbiter refuses before it builds anything, the runtime directory and the service it
claims, and what an earlier arbiter left in the journal, undone before this one serves.

The refusals run before a backend is probed or a line is logged: a start that must not happen
says so in one line, not after a backend's warning.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .. import paths, protocol
from ..connguard import ConnectionLimits
from ..errors import KrexError
from ..rpc_server import Service, lock_holder
from .journal import undo_outstanding

if TYPE_CHECKING:
    from ..enforcement.drain import Locker
    from ..gpu import GpuBackend
    from .quotas import Quotas

log = logging.getLogger("krex.arbiter")


def another_arbiter(note: str, root: Path, endpoint: str) -> str:
    """The one line a second arbiter on ``root`` exits with (``note``: what the holder wrote in the lock)."""
    pid = note.strip().split()[0] if note.strip() else ""
    who = f"another arbiter (pid {pid})" if pid.isdigit() else "another arbiter"
    return f"{who} already serves {root} (its endpoint {endpoint}): stop it first, or give this one --runtime-dir"


def refuse_unprivileged(multi_user: bool, allowed: bool) -> None:
    """An ordinary user's multi-user arbiter is refused unless ``allowed`` (a trusted test)."""
    if multi_user and os.geteuid() != 0 and not allowed:
        raise KrexError(
            "--multi-user needs root: run by an ordinary user, other users could stop this "
            "user's processes and its regions could not hold against theirs. Run it as root "
            "(a system service), or set Arbiter.allow_unprivileged_multi_user for a trusted test."
        )


def claim_runtime_dir(runtime_dir: str, endpoint: str, multi_user: bool) -> tuple[Path, str]:
    """The runtime directory, prepared, and the endpoint to serve; refused while another arbiter
    holds the directory's lock."""
    root = paths.prepare_runtime_dir(Path(runtime_dir) if runtime_dir else paths.runtime_dir(), multi_user=multi_user)
    endpoint = endpoint or os.environ.get(paths.ENDPOINT_ENV) or f"ipc://{root / 'arbiter.sock'}"
    # Another arbiter here: say so before anything else is probed or logged (one line, not a
    # backend warning first). serve() still takes the lock: this only reads who holds it.
    holder = lock_holder(root / "arbiter.lock", wait=5.0)
    if holder is not None:
        raise KrexError(another_arbiter(holder, root, endpoint))
    return root, endpoint


def arbiter_service(endpoint: str, events: str, root: Path, multi_user: bool, quotas: Quotas) -> Service:
    """The arbiter's service on ``endpoint`` (its sockets, lock and connection limits), no handler yet."""
    return Service(
        "arbiter",
        endpoint,
        {},
        protocol.decode_request,
        events=events,
        lock=root / "arbiter.lock",
        socket_mode=0o666 if multi_user else 0o600,
        connections=ConnectionLimits(quotas.connections_per_user, quotas.connections, quotas.is_admin),
    )


def replay_journal(path: Path, backend: GpuBackend, locker: Locker) -> None:
    """Undo what an earlier arbiter left outstanding in the journal at ``path``; its driver locks
    are undone by ``locker``, where they are of this arbiter's backend."""

    def unlock(name: str, procs: list[tuple[int, int]]) -> list[str]:
        if name != backend.name or not backend.capabilities.lock:
            return [f"cannot unlock {len(procs)} processes of backend {name} from {backend.name}"]
        return locker.unlock_sync(procs)

    summary = undo_outstanding(path, unlock)
    if summary.undid:
        log.warning("replayed the journal of an earlier arbiter: %s", summary)
