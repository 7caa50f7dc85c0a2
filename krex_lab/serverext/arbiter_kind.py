"""Which arbiter a Jupyter server uses, in words: the server's log, ``/krex/api/status`` and
``%krex_status`` say the same thing.

``node``      the node's one root arbiter (``ipc:///run/krex/arbiter.sock`` by default): a
              JupyterHub node, every user's server connects to it
``embedded``  an arbiter this server started and ends with it (single user)
``user``      another arbiter of this user (``KREX_ENDPOINT``, ``krex arbiter`` in a terminal)

The server exports the kind as ``KREX_ARBITER_KIND`` to its kernels; this module imports
nothing heavy (the kernel side uses it).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .. import protocol

from ..discovery import NODE_ENDPOINT, NODE_ENDPOINT_ENV  # noqa: F401 - named here too

#: exported by the server to its kernels: ``node``, ``embedded`` or ``user``
KIND_ENV = "KREX_ARBITER_KIND"

KINDS = ("node", "embedded", "user")


def listener_uid(endpoint: str) -> int | None:
    """The uid of the process listening at an ``ipc://`` endpoint (from the kernel), else None."""
    if not endpoint.startswith("ipc://"):
        return None
    from ..peercred import listener_credentials

    try:
        return listener_credentials(endpoint[len("ipc://") :])[1]
    except OSError:
        return None


def describe(kind: str, endpoint: str) -> str:
    """One line: ``node arbiter (root, ipc:///run/krex/arbiter.sock)``,
    ``embedded arbiter (this server's own)`` or ``arbiter of this user (ENDPOINT)``."""
    if kind == "embedded":
        return "embedded arbiter (this server's own)"
    if kind == "node":
        uid = listener_uid(endpoint)
        who = "root" if uid in (0, None) else f"uid {uid}"
        return f"node arbiter ({who}, {endpoint})"
    return f"arbiter of this user ({endpoint})"


def using_line(description: str, endpoint: str, info: protocol.Info | None, log: str = "") -> tuple[int, str]:
    """The server's one line on the arbiter it uses, and its log level: a warning for the fake
    backend (simulated GPUs), said with how to change their number."""
    from ..gpu import FAKE_GPUS

    where = f"pid {info.pid if info else '?'} at {endpoint}" + (f", log {log}" if log else "")
    gpus = info.gpus if info else "?"
    if info is None or not info.simulated:
        return logging.INFO, f"using the {description}: {where}, backend {info.backend if info else '?'}, {gpus} GPU(s)"
    default = " (the default; krex lab --fake-gpus N to change)" if gpus == FAKE_GPUS else ""
    return logging.WARNING, (
        f"using the {description}: {where}, no GPU found: the FAKE backend with {gpus} SIMULATED "
        f"GPU(s){default}: regions, freezing and placement are real, timings are not on a real GPU"
    )


def kind_of_current() -> str:
    """The kind this process's server exported (``KREX_ARBITER_KIND``); else guessed from the
    listener: root's socket, seen by a non-root process, is a node arbiter."""
    kind = os.environ.get(KIND_ENV, "")
    if kind in KINDS:
        return kind
    endpoint = os.environ.get("KREX_ENDPOINT", "")
    if endpoint and listener_uid(endpoint) == 0 and os.geteuid() != 0:
        return "node"
    return "user"
