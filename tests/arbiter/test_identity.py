"""Identity tickets: the kernel's word on who connected, spent once."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from krex_lab.arbiter.identity import Identity, IdentityServer, Tickets
from krex_lab.connection import fetch_ticket
from krex_lab.errors import PermissionDenied
from krex_lab.procutil import start_time


async def test_the_socket_hands_out_tickets_bound_to_the_kernels_identity(tmp_path: Path) -> None:
    tickets = Tickets()
    server = IdentityServer(str(tmp_path / "identity.sock"), tickets)
    await server.start()
    try:
        assert (os.stat(server.path).st_mode & 0o777) == 0o600
        ticket = await asyncio.to_thread(fetch_ticket, server.path)
        who = tickets.redeem(ticket)
        assert (who.pid, who.uid, who.gid) == (os.getpid(), os.geteuid(), os.getegid())
        with pytest.raises(PermissionDenied, match="single-use"):
            tickets.redeem(ticket)  # spent
    finally:
        server.close()
    assert not os.path.exists(server.path)


def test_tickets_expire_and_are_bounded() -> None:
    me = Identity(pid=os.getpid(), uid=os.getuid(), gid=os.getgid(), start=start_time(os.getpid()) or 0)
    short = Tickets(ttl=0.05)
    ticket = short.issue(me)
    time.sleep(0.1)
    with pytest.raises(PermissionDenied):
        short.redeem(ticket)
    few = Tickets(limit=3)
    issued = [few.issue(me) for _ in range(5)]
    assert len(few) == 3
    with pytest.raises(PermissionDenied):
        few.redeem(issued[0])  # the oldest were dropped
    assert few.redeem(issued[-1]).pid == os.getpid()


def test_a_ticket_of_a_process_that_exited_is_refused() -> None:
    gone = Identity(pid=os.getpid(), uid=0, gid=0, start=-1)  # this pid, another start time: a reused pid
    tickets = Tickets()
    with pytest.raises(PermissionDenied, match="exited"):
        tickets.redeem(tickets.issue(gone))
