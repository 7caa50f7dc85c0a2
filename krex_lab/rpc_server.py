"""One server lifecycle, shared by the arbiter and the pool: lock, bind, receive, dispatch, stop.

A :class:`Service` owns a ROUTER socket (and optionally a PUB socket for events), both created
when it is built and bound by :meth:`Service.bind`. Requests are decoded by the server's
:class:`Wire` into typed msgspec structs and dispatched through a handler table keyed by the
request's type; every request gets exactly one reply (``Reply``), whether its handler returns a
value, raises a :class:`~krex_lab.errors.KrexError`, returns a coroutine, or keeps the
:class:`Peer` to answer later. Whatever a message does, the service survives it.

Who calls what: the owner (``Arbiter``, ``Pool``) builds the service with its handler table,
calls :meth:`Service.take_lock` and :meth:`Service.bind` when it starts serving, runs
:meth:`Service.run` with its background tasks, and :meth:`Service.close` when it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from . import protocol
from .connguard import ConnectionGuard, ConnectionLimits
from .errors import KrexError, ProtocolError
from .paths import open_private

log = logging.getLogger("krex.service")
#: messages taken from the socket in one go, without going back to the event loop
_BATCH = 256

#: the listeners' accept queue (libzmq's default is 100): short, see Service.__init__
_BACKLOG = 64

#: a handler's return value saying "I kept the peer and will reply myself"
DEFERRED: Any = object()

Handler = Callable[[Any, "Peer"], Any]


def ipc_path(endpoint: str) -> str | None:
    """The socket file of an ``ipc://`` endpoint, else None."""
    return endpoint[len("ipc://") :] if endpoint.startswith("ipc://") else None


#: the longest path a UNIX socket takes (``sizeof(sockaddr_un.sun_path)`` less its terminator)
SOCKET_PATH_MAX = 107


def check_socket_path(endpoint: str) -> None:
    """A :class:`KrexError` that names the path and the limit when an ``ipc://`` endpoint's file
    (or a plain socket file's path) is longer than a UNIX socket allows: ZeroMQ's error and
    Python's ("AF_UNIX path too long") name neither the fix nor the cause."""
    path = ipc_path(endpoint) if "://" in endpoint else endpoint
    if path and len(os.fsencode(path)) > SOCKET_PATH_MAX:
        raise KrexError(
            f"the socket path {path} is {len(os.fsencode(path))} bytes, over the {SOCKET_PATH_MAX} a UNIX "
            "socket takes: give a shorter runtime directory (--runtime-dir or $KREX_RUNTIME_DIR)"
        )


def lock_holder(path: Path, wait: float = 0.0) -> str | None:
    """What the process holding the lock file ``path`` wrote in it (its pid) when one holds it for
    ``wait`` seconds; None when it is free or absent. Takes nothing: a server that must not start
    (another one serves) can say so before it probes or logs anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None  # no lock file (nobody ever served here), or not one to read: serve() decides
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
                return None
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return os.pread(fd, 64, 0).decode(errors="replace")
                time.sleep(0.05)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Peer:
    """The client a request came from, and the way to answer that request (exactly once)."""

    service: Service
    identity: bytes
    envelope: tuple[bytes, ...]
    rid: int | None

    def reply(self, result: Any = None, error: KrexError | None = None) -> None:
        self.service.reply(self, result, error)

    def send(self, message: Any) -> None:
        """An extra message to this client (pool output, arbiter control), not the reply."""
        self.service.send(self.identity, message)


class Service:
    def __init__(
        self,
        name: str,
        endpoint: str,
        handlers: Mapping[type, Handler],
        decode: Callable[[bytes], Any],
        *,
        events: str | None = None,
        lock: Path | None = None,
        socket_mode: int = 0o600,
        max_message: int = protocol.MAX_MESSAGE,
        lossless: bool = False,
        connections: ConnectionLimits | None = None,
        signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT),
    ) -> None:
        self.name = name
        self.endpoint = endpoint
        self.events = events
        self.handlers = dict(handlers)
        self._decode = decode
        self.lock_path = lock
        self.socket_mode = socket_mode
        self.signals = signals
        self.ctx = zmq.asyncio.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        # libzmq drops (and disconnects) a peer whose message exceeds this, before anything decodes it.
        self.router.setsockopt(zmq.MAXMSGSIZE, max_message)
        # A short accept queue: under a flood of connections (refused, and back at once) it is
        # full, and a newcomer waits behind all of it for the refusals (4 x 5,000 DEALERs: 4,096
        # deep, 2-5 s; 256, 1.2-1.9 s; 64, 0.45-0.6 s on a loaded 2-core machine); a connect
        # that finds it full is retried by the client (peercred.listener_credentials, RECONNECT_IVL).
        self.router.setsockopt(zmq.BACKLOG, _BACKLOG)
        if lossless:  # the pool: never drop a job's output or result
            self.router.setsockopt(zmq.SNDHWM, 0)
            self.router.setsockopt(zmq.RCVHWM, 0)
        self.pub = self.ctx.socket(zmq.PUB) if events else None
        if self.pub is not None:
            self.pub.setsockopt(zmq.LINGER, 0)
            self.pub.setsockopt(zmq.BACKLOG, _BACKLOG)
            # A subscriber that does not read loses events beyond this, instead of growing us.
            self.pub.setsockopt(zmq.SNDHWM, 100)
        # Plain (non-asyncio) views of the same sockets: sends never block (ROUTER and PUB drop
        # for a gone or slow peer) and the asyncio socket's per-send futures cost more than the message.
        self._router_sync: zmq.Socket[bytes] = zmq.Socket.shadow(self.router.underlying)
        self._rearmed = False  # a look for requests a send may have hidden is already queued
        self._pub_sync: zmq.Socket[bytes] | None = (
            zmq.Socket.shadow(self.pub.underlying) if self.pub is not None else None
        )
        #: refuses connections over their limits before they run the process out of descriptors
        self.guard = ConnectionGuard(name, self.ctx, connections or ConnectionLimits())
        self.guard.watch(self.router, "request")
        if self.pub is not None:
            self.guard.watch(self.pub, "events")
        self._lockfd: int | None = None
        self._stopping = asyncio.Event()
        #: the signal that stopped :meth:`run` (None: :meth:`stop`, or still running)
        self.stopped_by: signal.Signals | None = None
        self._tasks: set[asyncio.Future[Any]] = set()
        self.bound = False

    # -- lifecycle ------------------------------------------------------------------------------
    def take_lock(self, note: str = "", wait: float = 0.0) -> bool:
        """Hold ``lock`` (flock) for life; False when another process holds it ``wait`` seconds
        long (a guardian or supervisor holds it for the moment an undo takes). The file is
        opened without following a link and must be ours (:func:`krex_lab.paths.open_private`),
        so a planted symlink or hard link cannot redirect the write."""
        if self.lock_path is None:
            return True
        try:
            fd = open_private(self.lock_path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise KrexError(f"cannot open the lock file {self.lock_path}: {exc.strerror}") from None
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.05)
        if note:
            os.ftruncate(fd, 0)
            os.pwrite(fd, note.encode(), 0)
        self._lockfd = fd
        return True

    def bind(self) -> None:
        for ep in (self.endpoint, self.events):
            check_socket_path(ep or "")
        self.guard.start()  # before the first connection can be accepted
        old = os.umask(0o077)
        try:
            self.router.bind(self.endpoint)
            if self.pub is not None and self.events:
                self.pub.bind(self.events)
        finally:
            os.umask(old)
        for ep in (self.endpoint, self.events):
            path = ipc_path(ep or "")
            if path:
                os.chmod(path, self.socket_mode)
        self.bound = True

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
        """Run ``coro`` as a task the service keeps a reference to (the loop holds tasks weakly)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def run(self, background: list[Coroutine[Any, Any, Any]], ready: asyncio.Event | None = None) -> None:
        """Serve until :meth:`stop` or a signal; background tasks are cancelled on the way out."""
        loop = asyncio.get_running_loop()
        for sig in self.signals:
            loop.add_signal_handler(sig, self._on_signal, sig)
        tasks = [asyncio.ensure_future(self._recv_loop()), *(asyncio.ensure_future(c) for c in background)]
        if ready is not None:
            ready.set()
        try:
            await self._stopping.wait()
        finally:
            for t in tasks:
                t.cancel()
            for sig in self.signals:
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        self.stopped_by = signal.Signals(sig)
        self._stopping.set()

    def stop(self) -> None:
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def close(self, linger_ms: int = 0) -> None:
        """Close the sockets and remove their files: a socket file left behind would make clients
        wait for a reply that never comes. The lock file stays (unlinking it would let two
        servers lock two different files)."""
        for t in list(self._tasks):
            t.cancel()
        self.guard.close()
        self.router.close(linger=linger_ms)
        if self.pub is not None:
            self.pub.close()
        self.ctx.term()
        if self.bound:
            for ep in (self.endpoint, self.events):
                path = ipc_path(ep or "")
                if path:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
        if self._lockfd is not None:
            os.close(self._lockfd)
            self._lockfd = None

    # -- sending --------------------------------------------------------------------------------
    def send(self, identity: bytes, message: Any) -> None:
        self._send(self._router_sync, [identity, protocol.encode(message)])

    def publish(self, topic: str, message: Any) -> None:
        if self._pub_sync is not None:
            self._send(self._pub_sync, [topic.encode(), protocol.encode(message)])

    def reply(self, peer: Peer, result: Any = None, error: KrexError | None = None) -> None:
        body = protocol.Reply(id=peer.rid, result=result) if error is None else protocol.error_reply(peer.rid, error)
        self._send(self._router_sync, [peer.identity, *peer.envelope, protocol.encode(body)])

    def _send(self, sock: zmq.Socket[bytes], frames: list[bytes]) -> None:
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            log.warning("%s: dropped a message to a peer that is not reading", self.name)
        except zmq.ZMQError as exc:  # closed while stopping
            log.debug("%s: send failed: %s", self.name, exc)
        if sock is self._router_sync:
            self._rearm()

    def _rearm(self) -> None:
        """A send on the sync shadow processes the socket's pending commands, and with them it can
        consume the edge-triggered descriptor's signal of a request that arrived meanwhile: the
        loop would then sleep with that request unread (seen: a Status unanswered for 10 s, the
        arbiter idle in select). Look, as pyzmq does after its own sends, and take it if so."""
        if self._rearmed:
            return
        try:
            events = self._router_sync.get(zmq.EVENTS)
            loop = asyncio.get_running_loop()
        except (zmq.ZMQError, RuntimeError):  # closed, or not on the loop
            return
        if isinstance(events, int) and events & zmq.POLLIN:
            self._rearmed = True
            loop.call_soon(self._take_pending)

    def _take_pending(self) -> None:
        self._rearmed = False
        batch = self._queued()
        for frames in batch:
            self._handle_logged(frames)
        if len(batch) == _BATCH:
            self._rearm()  # perhaps more than a batch: the rest after the loop's other work

    def _queued(self) -> list[list[bytes]]:
        """What the ROUTER holds now, taken without waiting (a batch at most)."""
        batch: list[list[bytes]] = []
        for _ in range(_BATCH):
            try:
                batch.append(self._router_sync.recv_multipart(zmq.NOBLOCK))
            except zmq.ZMQError:  # Again: all taken (or closed)
                break
        return batch

    def _handle_logged(self, frames: list[bytes]) -> None:
        try:
            self.handle(frames)
        except Exception:  # a server never dies of a message
            log.exception("%s: unexpected error handling a message", self.name)

    # -- receiving ------------------------------------------------------------------------------
    async def _recv_loop(self) -> None:
        # After each wake-up, take whatever else is queued without going back to the loop:
        # the drain acks of many sessions arrive together.
        while True:
            batch = [await self.router.recv_multipart(copy=True), *self._queued()]
            for frames in batch:
                self._handle_logged(frames)

    def handle(self, frames: list[bytes]) -> None:
        """Decode one message and run its handler; every path ends in exactly one reply."""
        identity, body = frames[0], frames[1:]
        envelope: tuple[bytes, ...] = ()
        if len(body) == 2 and body[0] == b"":  # a REQ client's delimiter
            envelope, body = (b"",), body[1:]
        if len(body) != 1:
            peer = Peer(self, identity, envelope, None)
            peer.reply(None, ProtocolError(f"expected one message frame, got {len(body)}"))
            return
        data = body[0]
        try:
            request = self._decode(data)
        except ProtocolError as exc:
            Peer(self, identity, envelope, protocol.request_id(data)).reply(None, exc)
            return
        peer = Peer(self, identity, envelope, request.id)
        handler = self.handlers.get(type(request))
        if handler is None:
            peer.reply(None, ProtocolError(f"{self.name} does not serve {type(request).__name__} requests"))
            return
        try:
            result = handler(request, peer)
        except KrexError as exc:
            peer.reply(None, exc)
            return
        except Exception as exc:  # a bug in a handler still answers its request
            log.exception("%s: %s request failed", self.name, type(request).__name__)
            peer.reply(None, KrexError(f"internal error in the {self.name}: {type(exc).__name__}: {exc}"))
            return
        if asyncio.iscoroutine(result):
            self.spawn(result).add_done_callback(lambda t: self._finish(t, peer))
        elif result is not DEFERRED:
            peer.reply(result)

    def _finish(self, task: asyncio.Future[Any], peer: Peer) -> None:
        if task.cancelled():
            peer.reply(None, KrexError(f"the {self.name} is shutting down"))
        elif isinstance(task.exception(), KrexError):
            peer.reply(None, task.exception())  # type: ignore[arg-type]
        elif task.exception() is not None:
            log.error("%s: request failed", self.name, exc_info=task.exception())
            peer.reply(None, KrexError(f"internal error: {task.exception()}"))
        else:
            peer.reply(task.result())
