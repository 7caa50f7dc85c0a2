"""Who is on the other end of a registration: what the kernel says, never what a message claims.

The arbiter listens on a UNIX stream socket (``identity.sock`` in its runtime dir). A client that
wants to register connects to it; the arbiter reads the connecting process's pid, uid and gid
from the kernel (``SO_PEERCRED``), refuses a process whose real and effective uid differ (a
setuid program acting for someone else), and writes back a *ticket*: a random one-time name
bound to that pid and uid, valid for :data:`TICKET_TTL` seconds. ``register`` carries the
ticket; the arbiter redeems it (once) and so knows the registering user from the kernel. No file
a user could plant or name is ever trusted.

Called by: ``Arbiter.serve`` (:meth:`IdentityServer.start` / :meth:`IdentityServer.close`) and the
``register`` handler (:meth:`Tickets.redeem`); clients ask with :func:`krex_lab.connection.fetch_ticket`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from dataclasses import dataclass

from ..errors import PermissionDenied
from ..peercred import peer_credentials
from ..procutil import real_and_effective_uid, start_time

log = logging.getLogger("krex.identity")

#: seconds a ticket stays valid (a registration follows its ticket at once)
TICKET_TTL = 10.0
#: tickets outstanding at once; beyond it the oldest are dropped (a flood costs memory, not the arbiter)
MAX_TICKETS = 4096


@dataclass(frozen=True)
class Identity:
    """A process as the kernel described it when it connected."""

    pid: int
    uid: int
    gid: int
    start: int  # the pid's start time, so a reused pid never inherits the identity


class Tickets:
    """One-time tickets bound to a kernel-given identity."""

    def __init__(self, ttl: float = TICKET_TTL, limit: int = MAX_TICKETS) -> None:
        self.ttl = ttl
        self.limit = limit
        self._issued: dict[str, tuple[float, Identity]] = {}

    def issue(self, who: Identity) -> str:
        self._expire()
        while len(self._issued) >= self.limit:
            self._issued.pop(next(iter(self._issued)))
        ticket = secrets.token_urlsafe(24)
        self._issued[ticket] = (time.monotonic() + self.ttl, who)
        return ticket

    def redeem(self, ticket: str) -> Identity:
        """The identity a ticket was issued to; the ticket is spent. Raises PermissionDenied."""
        entry = self._issued.pop(ticket, None) if isinstance(ticket, str) else None
        if entry is None or entry[0] < time.monotonic():
            raise PermissionDenied(
                "no valid identity ticket: ask the arbiter's identity socket for a fresh one "
                "right before registering (tickets are single-use and expire after "
                f"{self.ttl:g} s)"
            )
        who = entry[1]
        if start_time(who.pid) != who.start:
            raise PermissionDenied(f"process {who.pid} that asked for this ticket has exited")
        return who

    def _expire(self) -> None:
        now = time.monotonic()
        for ticket in [t for t, (deadline, _) in self._issued.items() if deadline < now]:
            del self._issued[ticket]

    def __len__(self) -> int:
        return len(self._issued)


class IdentityServer:
    """The ``identity.sock`` listener: one short exchange per connection, on the event loop."""

    def __init__(self, path: str, tickets: Tickets, mode: int = 0o600) -> None:
        self.path = path
        self.tickets = tickets
        self.mode = mode
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # ours from an earlier arbiter: the runtime dir is ours alone
        old = os.umask(0o077)
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=self.path, backlog=128)
        finally:
            os.umask(old)
        os.chmod(self.path, self.mode)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            sock = writer.get_extra_info("socket")
            pid, uid, gid = peer_credentials(sock)
            line = self._answer(pid, uid, gid)
            writer.write(line.encode() + b"\n")
            await asyncio.wait_for(writer.drain(), 1.0)
        except (OSError, asyncio.TimeoutError) as exc:
            log.debug("identity exchange failed: %s", exc)
        finally:
            writer.close()

    def _answer(self, pid: int, uid: int, gid: int) -> str:
        real, effective = real_and_effective_uid(pid)
        start = start_time(pid)
        if start is None or real is None:
            return "error process gone"
        if real != effective:
            return (
                f"error process {pid} runs with real uid {real} but effective uid {effective} (setuid): "
                "KREX registers only processes acting as themselves"
            )
        return "ticket " + self.tickets.issue(Identity(pid=pid, uid=uid, gid=gid, start=start))

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        with contextlib.suppress(OSError):
            os.unlink(self.path)
