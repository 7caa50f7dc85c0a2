"""One connection to the arbiter: :class:`Connection` (a DEALER socket, used by one thread at a
time; only to a listener that is root's or this user's), and the one-shot requests that need no
session, :func:`hello` and :func:`status`."""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import msgspec
import zmq

from . import discovery, paths, protocol
from .errors import ArbiterUnavailable, PermissionDenied, ProtocolError, RegionCancelled, error_from_wire
from .peercred import listener_credentials, peer_credentials

#: how long a plain request (not an acquire) waits for its reply
REQUEST_TIMEOUT = 10.0
_ids = itertools.count(1)


def start_hint(endpoint: str) -> str:
    """What to do about an arbiter that does not answer at ``endpoint``. A node's arbiter (another
    user's directory, root's /run/krex on a JupyterHub, or the node endpoint the server was given)
    is not the user's to start: say whom to ask. Otherwise: how to start one's own."""
    path = endpoint[len("ipc://") :] if endpoint.startswith("ipc://") else ""
    node = bool(endpoint) and endpoint == os.environ.get("KREX_NODE_ENDPOINT")
    # A kernel (or its dashboard) of a lab that joined the node's arbiter: the lab says so.
    node = node or (os.environ.get("KREX_ARBITER_KIND") == "node" and endpoint == os.environ.get(paths.ENDPOINT_ENV))
    if path and not node:
        try:
            node = os.stat(os.path.dirname(path) or ".").st_uid != os.geteuid()
        except OSError:
            pass
    if node:
        return (
            "It is the node's arbiter, run by the administrator (on a JupyterHub, the hub's "
            "krex-arbiter service): its supervisor normally restarts it within seconds; if it "
            "stays down, ask them to start it, then run this again."
        )
    return f"Start one with `krex arbiter` (or `make lab`), or point {paths.ENDPOINT_ENV} at a running one."


def _unavailable(endpoint: str, why: str) -> ArbiterUnavailable:
    return ArbiterUnavailable(f"no KREX arbiter answers at {endpoint} ({why}). {start_hint(endpoint)}")


def _check_listener(path: str) -> None:
    """Only root's arbiter (a node's) or our own (an embedded one) gets our requests: another
    user's process listening at the endpoint would capture registrations and answer with lies."""
    try:
        _, uid, _ = listener_credentials(path)
    except FileNotFoundError:
        raise _unavailable(f"ipc://{path}", "its socket file does not exist") from None
    except OSError as exc:
        raise ArbiterUnavailable(
            f"no KREX arbiter listens at ipc://{path} ({exc.strerror or exc}). {start_hint(f'ipc://{path}')}"
        ) from None
    if uid not in (0, os.geteuid()):
        raise PermissionDenied(
            f"ipc://{path} is served by uid {uid}, neither root nor you: not an arbiter of "
            "this node, nothing was sent to it"
        )


class Connection:
    """One DEALER socket to the arbiter, used by one thread at a time."""

    def __init__(self, endpoint: str | None = None) -> None:
        self.endpoint = endpoint or discovery.default_endpoint()
        if self.endpoint.startswith("ipc://"):
            _check_listener(self.endpoint[6:])
        self.socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        # Retry a refused or queued-out connect soon, and keep retrying soon: a flood of others'
        # connections fills the arbiter's accept queue, and a connect backed off to a second
        # between tries lost to the flood's every 10 ms (a session's hello ran out of time).
        self.socket.setsockopt(zmq.RECONNECT_IVL, 10)
        self.socket.setsockopt(zmq.RECONNECT_IVL_MAX, 100)
        self.socket.connect(self.endpoint)
        self.arbiter_pid: int | None = None
        self._identity: str | None = None  # the arbiter's identity socket, learnt from one hello

    def send(self, request: protocol.Request) -> int:
        """Send ``request`` (its ``id`` is set here); returns the id to :meth:`wait` for."""
        request.id = next(_ids)
        data = protocol.encode(request)
        if len(data) > protocol.MAX_MESSAGE:  # the arbiter's socket would drop it unanswered
            raise ProtocolError(
                f"a {type(request).__name__} request of {len(data)} bytes exceeds the limit of {protocol.MAX_MESSAGE}"
            )
        self.socket.send(data)
        return request.id

    def wait(
        self,
        rid: int,
        timeout: float | None = REQUEST_TIMEOUT,
        cancelled: threading.Event | None = None,
        slow: tuple[float, Callable[[], object]] | None = None,
    ) -> Any:
        """The raw result of request ``rid``; raises the error the arbiter sent, or ArbiterUnavailable.
        ``slow``: (seconds, what to call once if the reply has not come by then)."""
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        while True:
            if slow is not None and time.monotonic() >= start + slow[0]:
                slow[1]()
                slow = None
            slice_ms = 200
            for until in (deadline, None if slow is None else start + slow[0]):
                if until is not None:
                    slice_ms = max(0, min(slice_ms, int((until - time.monotonic()) * 1000)))
            if self.socket.poll(slice_ms):
                msg = protocol.decode_incoming(self.socket.recv())
                if not isinstance(msg, protocol.Reply) or msg.id != rid:
                    continue  # a late reply to an earlier, abandoned request
                if msg.ok:
                    return msg.result
                assert msg.error is not None
                raise error_from_wire(msg.error.type, msg.error.message, msg.error.traceback)
            if cancelled is not None and cancelled.is_set():
                raise RegionCancelled("cancelled while waiting")
            if self.arbiter_pid is not None and not os.path.exists(f"/proc/{self.arbiter_pid}"):
                raise _unavailable(self.endpoint, f"the arbiter (pid {self.arbiter_pid}) exited")
            if deadline is not None and time.monotonic() >= deadline:
                raise _unavailable(self.endpoint, f"no reply within {timeout:.0f} s")

    def ticket(self, timeout: float = 2.0) -> str:
        """An identity ticket of this process (the arbiter shows its own sessions in full), or ""
        where the arbiter has no identity socket this process can reach (a remote endpoint)."""
        try:
            if self._identity is None:
                info: protocol.Info = self.call(protocol.Hello(), timeout=timeout)
                self._identity = info.identity
            return fetch_ticket(self._identity, timeout)
        except (ArbiterUnavailable, PermissionDenied):
            self._identity = None  # ask again next time: the arbiter may have moved or restarted
            return ""

    def call(self, request: protocol.Request, timeout: float | None = REQUEST_TIMEOUT) -> Any:
        """Send ``request`` and return its result as the struct ``request.reply`` names."""
        return protocol.result_as(request, self.wait(self.send(request), timeout))

    def close(self) -> None:
        self.socket.close(linger=0)


def hello(endpoint: str | None = None, timeout: float = 2.0) -> protocol.InfoDict:
    """Who the arbiter at ``endpoint`` is (:class:`~krex_lab.protocol.Info`, as a dict)."""
    conn = Connection(endpoint)
    try:
        info: protocol.Info = conn.call(protocol.Hello(), timeout=timeout)
        return cast(protocol.InfoDict, msgspec.structs.asdict(info))
    finally:
        conn.close()


def status(endpoint: str | None = None, timeout: float = REQUEST_TIMEOUT) -> dict[str, Any]:
    conn = Connection(endpoint)
    try:
        result: dict[str, Any] = conn.call(protocol.Status(ticket=conn.ticket()), timeout=timeout)
        return result
    finally:
        conn.close()


def fetch_ticket(path: str, timeout: float = 5.0) -> str:
    """A ticket for this process from the arbiter's identity socket (``krex_lab.arbiter.identity``
    serves it), which ``register`` then redeems."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            _, uid, _ = peer_credentials(sock)
            if uid not in (0, os.geteuid()):
                # Someone else's "arbiter": a ticket from it would be worthless, and it would learn
                # who we are. Root's (a node arbiter) or our own (an embedded one) only.
                raise PermissionDenied(
                    f"the identity socket {path} is served by uid {uid}, neither root nor "
                    "you: not an arbiter of this node"
                )
            data = b""
            while not data.endswith(b"\n") and len(data) < 4096:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
        except OSError as exc:
            raise ArbiterUnavailable(f"the arbiter's identity socket {path} does not answer: {exc}") from None
    kind, _, value = data.decode(errors="replace").strip().partition(" ")
    if kind == "ticket" and value:
        return value
    raise PermissionDenied(value or "the arbiter's identity socket closed without a ticket")
