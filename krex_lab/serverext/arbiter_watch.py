"""A server that joined an arbiter it did not start (the node's, or another of this user's) notices
when it is gone and when it is back.

The node's arbiter is never replaced: the server says loudly that it is gone, in its log and in
``/krex/api/status``'s ``problems`` (the admin page, ``%krex_status``; the dashboard shows the
arbiter LOST with the same hint), and picks it up again when it listens once more (the kernels'
sessions register again at their next request). An embedded arbiter in its place would be a
second arbiter on the node's GPUs, and two arbiters each give the same GPU away: a region of
ours would no longer stop the other users' sessions, nor theirs ours, and every timing on the
node would be corrupted without a word. The node's arbiter is also about to come back (systemd's
``Restart=``, ``krex supervise``) and would find its GPUs shared; and a server cannot tell a
crash from an administrator's deliberate stop.

Another arbiter of this very user (a ``krex arbiter`` in a terminal, on this server's runtime dir)
is replaced by the server's embedded arbiter, at the same endpoint so that the kernels find it
there: what the server would have started had that one not been running, and nobody else's
sessions are at stake. Only once no arbiter holds the runtime dir's lock: one that ``krex
supervise`` is restarting holds it, and is picked up when it answers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .. import discovery

if TYPE_CHECKING:
    from .. import protocol


def gone_message(description: str, endpoint: str, kind: str) -> str:
    """What the log and the status say while the arbiter is gone: what it means and what to do."""
    if kind == "node":
        what = (
            "the node's supervisor (systemd's krex-arbiter.service, or krex supervise) normally "
            "restarts it within seconds; if it stays gone, ask the node's administrator"
        )
    else:
        what = "start it again (`krex arbiter`), or stop this server and start `krex lab` again for an embedded one"
    return (
        f"the {description} is GONE (nothing listens at {endpoint}): no region can be granted and "
        f"new kernels start without a GPU placement until it is back. This server does not start an "
        f"arbiter of its own in its place: two arbiters would each give the same GPU away. {what}; "
        "KREX picks it up again by itself when it is back"
    )


def replaceable(kind: str, endpoint: str, runtime: Path, lock_held: Callable[[Path], bool]) -> bool:
    """Whether the gone arbiter at ``endpoint`` may be replaced by this server's embedded one: this
    user's own, its socket in this server's runtime dir ``runtime``, which no arbiter holds now."""
    if kind != "user" or not endpoint.startswith("ipc://"):
        return False
    socket = Path(endpoint[len("ipc://") :])
    if os.path.realpath(socket.parent) != os.path.realpath(runtime):
        return False
    try:
        if os.stat(runtime).st_uid != os.geteuid():
            return False
    except OSError:
        return False
    return not lock_held(runtime / "arbiter.lock")


class ArbiterWatch:
    """Whether the arbiter at ``endpoint`` still listens; :meth:`check` returns what changed:
    ``"gone"``, ``"back"`` or None."""

    def __init__(self, endpoint: str, probe: Callable[[str, float], protocol.Info | None]) -> None:
        self.endpoint = endpoint
        self.probe = probe
        self.lost_since: float | None = None
        self.misses = 0

    def _answers(self) -> bool:
        if self.endpoint.startswith("ipc://"):
            # Nobody listening is gone at once; a busy arbiter still listens (and is not gone).
            return discovery.listened(self.endpoint)
        return self.probe(self.endpoint, 2.0) is not None

    def check(self) -> str | None:
        if self._answers():
            self.misses = 0
            if self.lost_since is None:
                return None
            self.lost_since = None
            return "back"
        self.misses += 1
        # A tcp arbiter that missed one hello may only be slow: gone after two checks in a row.
        if self.lost_since is None and (self.endpoint.startswith("ipc://") or self.misses >= 2):
            self.lost_since = time.time()
            return "gone"
        return None
