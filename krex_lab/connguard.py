"""Connections are a quota: how many connections one user, and everyone together, may keep open
to a server's ZeroMQ sockets, enforced before the process runs out of descriptors.

Why it is needed: libzmq's IPC listener aborts the whole process (``Too many open files
(src/ipc_listener.cpp:297)``) when ``accept`` fails with EMFILE, so a user who opens enough
connections (DEALERs that never send a request, SUBs that never read) kills the arbiter, and
every user's sessions and regions with it; its supervisor restarts it, the connections come
back, and it dies again.

How: each watched socket's monitor reports every accepted connection with its descriptor. A
thread of the guard reads those events at once, asks the kernel who is at the other end
(``SO_PEERCRED``) and refuses, with ``shutdown(2)`` (libzmq then sees the peer leave and closes
it), a connection that is over one of three limits:

* the process is near its descriptor limit: the accepted descriptor's number is within
  :func:`headroom` of ``RLIMIT_NOFILE`` (descriptors are allocated lowest first, so the number
  says how many are open); the headroom is larger than the monitor's queue (1,000 events), so
  that connections libzmq accepted before the guard read their events cannot reach the limit;
* the socket has ``total`` connections (default: half of what the limit leaves after the
  headroom: the other half is the sessions' pidfds and kept /proc files);
* the peer's uid has ``per_user`` connections on this socket (never for ``exempt`` uids).

While its events wait, the monitor's queue fills and libzmq's I/O thread waits for the guard
(it sends monitor events blocking): a flood slows the flooder's accepts, it cannot outrun the
guard. A refused connection's owner is logged once per burst (its first refusal, then a count
when it has been quiet for :data:`BURST_GAP` seconds), not once per connection.
"""

from __future__ import annotations

import collections
import logging
import os
import pwd
import resource
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from .peercred import peer_credentials

log = logging.getLogger("krex.connections")

#: seconds without a refusal that end a user's burst (its summary is logged then)
BURST_GAP = 10.0
#: events the monitor queues before libzmq's I/O thread waits (its pipe's high-water mark)
MONITOR_QUEUE = 1000
_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
#: a monitor event's first frame: event number (16 bits), value (32 bits: the descriptor)
_EVENT = struct.Struct("=hi")


def headroom(limit: int) -> int:
    """Descriptors the guard keeps free below ``limit``: more than the monitor may queue, where the
    limit allows it; never more than half the limit (a user's default 1024 would refuse every
    connection, the owner's own included)."""
    return min(max(MONITOR_QUEUE + 256, limit // 8), limit // 2)


def raise_fd_limit() -> int:
    """Raise this process's soft descriptor limit to its hard limit (any process may); returns the
    soft limit now. A server that guards its sockets does it first: a login's soft limit is often
    1024, far below what a node's clients open."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def fd_limit() -> int:
    """The soft descriptor limit now (read again every second: an operator may lower it with prlimit)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@dataclass(frozen=True)
class ConnectionLimits:
    """``per_user``: connections one uid may keep on one socket (0: no per-user cap);
    ``total``: on one socket for everyone (0: from the descriptor limit); ``exempt``: uids the
    per-user cap spares (root and the server's own user always)."""

    per_user: int = 0
    total: int = 0
    exempt: Callable[[int], bool] = field(default=lambda uid: False)


def _with_fd(fd: int, fn: Callable[[socket.socket], object]) -> object:
    """``fn`` on a socket object over ``fd`` that libzmq owns: never closes it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fd)
    try:
        return fn(sock)
    finally:
        sock.detach()


def _peer_uid(fd: int) -> int | None:
    try:
        return int(_with_fd(fd, lambda s: peer_credentials(s)[1]))  # type: ignore[call-overload]
    except OSError:  # not a UNIX socket (a tcp:// endpoint), or already gone
        return None


def _refuse(fd: int) -> None:
    try:
        _with_fd(fd, lambda s: s.shutdown(socket.SHUT_RDWR))
    except OSError:
        pass  # gone already


def _user(uid: int | None) -> str:
    if uid is None:
        return "a peer of unknown uid"
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


@dataclass
class _Burst:
    first: float
    last: float
    refused: int = 0
    why: str = ""


class _Watched:
    """One monitored socket: its connections by descriptor and by uid."""

    def __init__(self, label: str, address: str) -> None:
        self.label = label
        self.address = address
        self.open: dict[int, int | None] = {}
        self.per_uid: collections.Counter[int | None] = collections.Counter()

    def add(self, fd: int, uid: int | None) -> None:
        self.drop(fd)
        self.open[fd] = uid
        self.per_uid[uid] += 1

    def drop(self, fd: int) -> None:
        if fd in self.open:
            uid = self.open.pop(fd)
            self.per_uid[uid] -= 1
            if self.per_uid[uid] <= 0:
                del self.per_uid[uid]


class ConnectionGuard:
    """Watches sockets of ``ctx`` (call :meth:`watch` before binding them), from a thread of its own."""

    def __init__(self, name: str, ctx: zmq.Context[Any], limits: ConnectionLimits) -> None:
        self.name = name
        self.limits = limits
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.shadow(ctx.underlying)
        self._watched: list[_Watched] = []
        self._sockets: list[zmq.Socket[Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bursts: dict[int | None, _Burst] = {}
        self._own_uid = os.geteuid()
        raise_fd_limit()
        self._limit, self._limit_read = fd_limit(), time.monotonic()
        #: refusals so far, for status
        self.refused = 0

    def watch(self, sock: zmq.Socket[Any], label: str) -> None:
        address = f"inproc://krex-guard-{id(self)}-{len(self._watched)}"
        sock.monitor(address, _EVENTS)
        self._sockets.append(sock)
        self._watched.append(_Watched(label, address))

    def start(self) -> None:
        if self._thread is None and self._watched:
            self._thread = threading.Thread(target=self._run, name=f"{self.name}-connections", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the monitors, then the thread (its sockets close with it), before the context is
        terminated. In that order: a monitor sends its last events (a burst of disconnects, then
        MONITOR_STOPPED) on a PAIR socket, whose send blocks for good once its reader has closed
        (an arbiter ignoring SIGTERM after its sessions left at once, benchmarks/regions/scale.py)."""
        for sock in self._sockets:
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass
        self._sockets.clear()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def counts(self) -> dict[str, int]:
        """Open connections per watched socket, and refusals so far."""
        return {**{w.label: len(w.open) for w in self._watched}, "refused": self.refused}

    # -- the thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        pairs: list[tuple[zmq.Socket[bytes], _Watched]] = []
        poller = zmq.Poller()
        try:
            for w in self._watched:
                pair = self._ctx.socket(zmq.PAIR)
                pair.setsockopt(zmq.LINGER, 0)
                pair.connect(w.address)
                poller.register(pair, zmq.POLLIN)
                pairs.append((pair, w))
            by_socket = dict(pairs)
            while not self._stop.is_set():
                for pair, _ in poller.poll(500):
                    self._drain(pair, by_socket[pair])
                now = time.monotonic()
                if now - self._limit_read >= 1.0:
                    self._limit, self._limit_read = fd_limit(), now
                self._end_bursts(now)
        except Exception:  # the guard must never take the server down
            log.exception("%s: the connection guard stopped", self.name)
        finally:
            for pair, _ in pairs:
                pair.close(linger=0)

    def _drain(self, pair: zmq.Socket[bytes], watched: _Watched) -> None:
        # Per event: as little as possible, on a flood it is the rate at which refusals are made.
        recv = pair.recv_multipart
        for _ in range(MONITOR_QUEUE):
            try:
                frames = recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            event, fd = _EVENT.unpack_from(frames[0])
            if event == zmq.EVENT_ACCEPTED:
                self._accepted(fd, watched)
            else:
                watched.drop(fd)

    def _accepted(self, fd: int, watched: _Watched) -> None:
        limit = self._limit
        uid = _peer_uid(fd)
        why = ""
        if fd >= limit - headroom(limit):
            why = f"near its descriptor limit ({fd} of {limit} in use)"
        else:
            total = self.limits.total or max(16, (limit - headroom(limit)) // 2)
            if len(watched.open) >= total:
                why = f"{len(watched.open)} connections to its {watched.label} socket: the limit is {total}"
            elif self.limits.per_user and uid not in (None, 0, self._own_uid) and not self.limits.exempt(uid):
                mine = watched.per_uid[uid]
                if mine >= self.limits.per_user:
                    why = (
                        f"{mine} connections of this user to its {watched.label} socket: the limit is "
                        f"connections_per_user={self.limits.per_user}"
                    )
        if not why:
            watched.add(fd, uid)
            return
        _refuse(fd)
        self.refused += 1
        now = time.monotonic()
        burst = self._bursts.get(uid)
        if burst is None:
            burst = self._bursts[uid] = _Burst(now, now, why=why)
            log.warning("%s: refusing connections of %s: %s", self.name, _user(uid), why)
        burst.refused += 1
        burst.last = now

    def _end_bursts(self, now: float) -> None:
        for uid, burst in list(self._bursts.items()):
            if now - burst.last >= BURST_GAP:
                del self._bursts[uid]
                log.warning(
                    "%s: refused %d connections of %s over %.1f s (%s)",
                    self.name,
                    burst.refused,
                    _user(uid),
                    burst.last - burst.first,
                    burst.why,
                )
