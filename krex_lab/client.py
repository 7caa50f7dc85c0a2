"""The client side: talk to the arbiter, register a session, hold regions.

    import krex_lab
    with krex_lab.exclusive(gpu=0) as region:   # attaches this process if it has not
        run_timing_loop()
    print(region.report.summary())

A :class:`Session` registers from a socket that a background thread then owns: the arbiter
sends it ``drain`` (the thread synchronises this process's GPU work, pauses and answers),
``resume`` and ``lease_expired``. Requests from user threads go through one socket per
thread (:class:`Connection`), each reply matched to its request by id.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import msgspec
import zmq

from . import devsync, paths, protocol
from .arbiter.identity import fetch_ticket
from .errors import (
    ArbiterUnavailable,
    KrexError,
    LeaseExpired,
    PermissionDenied,
    ProtocolError,
    RegionCancelled,
    RegionRevoked,
    error_from_wire,
)
from .peercred import listener_credentials
from .wait_notice import WaitNotice

F = TypeVar("F", bound=Callable[..., Any])

#: how long a plain request (not an acquire) waits for its reply
REQUEST_TIMEOUT = 10.0
_ids = itertools.count(1)


def _unavailable(endpoint: str, why: str) -> ArbiterUnavailable:
    return ArbiterUnavailable(
        f"no KREX arbiter answers at {endpoint} ({why}). Start one with `krex arbiter` "
        f"(or `make lab`), or point {paths.ENDPOINT_ENV} at a running one."
    )


def _check_listener(path: str) -> None:
    """Only root's arbiter (a node's) or our own (an embedded one) gets our requests: another
    user's process listening at the endpoint would capture registrations and answer with lies."""
    try:
        _, uid, _ = listener_credentials(path)
    except FileNotFoundError:
        raise _unavailable(f"ipc://{path}", "its socket file does not exist") from None
    except OSError as exc:
        raise ArbiterUnavailable(
            f"no KREX arbiter listens at ipc://{path} ({exc.strerror or exc}). Start one "
            f"with `krex arbiter` (or `make lab`), or point {paths.ENDPOINT_ENV} at a "
            "running one."
        ) from None
    if uid not in (0, os.geteuid()):
        raise PermissionDenied(
            f"ipc://{path} is served by uid {uid}, neither root nor you: not an arbiter of "
            "this node, nothing was sent to it"
        )


class Connection:
    """One DEALER socket to the arbiter, used by one thread at a time."""

    def __init__(self, endpoint: str | None = None) -> None:
        self.endpoint = endpoint or paths.default_endpoint()
        if self.endpoint.startswith("ipc://"):
            _check_listener(self.endpoint[6:])
        self.socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
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

    def wait(self, rid: int, timeout: float | None = REQUEST_TIMEOUT, cancelled: threading.Event | None = None) -> Any:
        """The raw result of request ``rid``; raises the error the arbiter sent, or ArbiterUnavailable."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            slice_ms = 200
            if deadline is not None:
                slice_ms = max(0, min(slice_ms, int((deadline - time.monotonic()) * 1000)))
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


def hello(endpoint: str | None = None, timeout: float = 2.0) -> dict[str, Any]:
    """Who the arbiter at ``endpoint`` is (:class:`~krex_lab.protocol.Info`, as a dict)."""
    conn = Connection(endpoint)
    try:
        info: protocol.Info = conn.call(protocol.Hello(), timeout=timeout)
        return msgspec.structs.asdict(info)
    finally:
        conn.close()


def status(endpoint: str | None = None, timeout: float = REQUEST_TIMEOUT) -> dict[str, Any]:
    conn = Connection(endpoint)
    try:
        result: dict[str, Any] = conn.call(protocol.Status(ticket=conn.ticket()), timeout=timeout)
        return result
    finally:
        conn.close()


class Session:
    """This process (or ``pid``), registered with the arbiter. Use :func:`attach`."""

    def __init__(
        self,
        gpu: int | None = None,
        role: str = "client",
        name: str = "",
        endpoint: str | None = None,
        pid: int | None = None,
        control: bool = True,
    ) -> None:
        self.endpoint = endpoint or paths.default_endpoint()
        self.pid = pid or os.getpid()
        self.owner_pid = os.getpid()
        control_conn = Connection(self.endpoint)
        try:
            self.info: protocol.Info = control_conn.call(protocol.Hello(), timeout=2.0)
            control_conn.arbiter_pid = self.info.pid
            ticket = fetch_ticket(self.info.identity)
            if gpu is None and os.environ.get(paths.GPU_ENV, "").strip():
                gpu = int(os.environ[paths.GPU_ENV])
            # A process started inside a region by its holder (krex exclusive) is part of it.
            within = os.environ.get("KREX_REGION", "") if self.pid == os.getpid() else ""
            reply: protocol.Registered = control_conn.call(
                protocol.Register(
                    pid=0 if self.pid == os.getpid() else self.pid,
                    ticket=ticket,
                    role=role,
                    name=name,
                    gpu=gpu,
                    control=control,
                    within=within,
                )
            )
        except BaseException:
            control_conn.close()
            raise
        self.id = reply.session
        self.token = reply.token
        self.gpu = reply.gpu
        self.simulated = reply.simulated
        #: set while the arbiter has asked this session to stay off the GPU (another's region)
        self.paused = threading.Event()
        self.expired: set[str] = set()
        self.drain_hooks: list[Callable[[], None]] = []
        #: the wait notices of this session's acquires in progress (a drain makes them speak)
        self.waiting: set[WaitNotice] = set()
        #: the region this session holds on each GPU (an ``exclusive()`` inside it nests)
        self._held: dict[int, Exclusive] = {}
        self._held_lock = threading.Lock()
        self._local = threading.local()
        self._closed = threading.Event()
        self._control = control_conn
        self._thread = threading.Thread(target=self._control_loop, name=f"krex-control-{self.id}", daemon=True)
        self._thread.start()

    # -- requests -------------------------------------------------------------------------
    def connection(self) -> Connection:
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = Connection(self.endpoint)
            conn.arbiter_pid = self.info.pid
            conn._identity = self.info.identity
            self._local.conn = conn
        return conn

    def call(self, request: protocol.Request, timeout: float | None = REQUEST_TIMEOUT) -> Any:
        """A request of this session (``session`` and ``token`` are filled in)."""
        if isinstance(request, protocol.SessionRequest):
            request.session, request.token = self.id, self.token
        return self.connection().call(request, timeout)

    def holding(self, gpu: int) -> Exclusive | None:
        """The region this session holds on ``gpu`` through an :class:`Exclusive`, if any."""
        with self._held_lock:
            held = self._held.get(gpu)
        return held if held is not None and held.id not in self.expired else None

    def held_region(self, gpu: int | None = None) -> str | None:
        """The id of the region this session holds on ``gpu`` (None: on any GPU, that of the lowest one)."""
        with self._held_lock:
            gpus = sorted(self._held) if gpu is None else [gpu]
        return next((held.id for g in gpus if (held := self.holding(g)) is not None), None)

    def holds_any(self) -> bool:
        with self._held_lock:
            gpus = list(self._held)
        return any(self.holding(g) is not None for g in gpus)

    def close(self) -> None:
        if self._closed.is_set():
            return
        try:
            if os.getpid() == self.owner_pid:
                self.call(protocol.Unregister(), timeout=2.0)
        except KrexError:
            pass
        self._closed.set()
        self._thread.join(timeout=1.0)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- control messages -----------------------------------------------------------------
    def _control_loop(self) -> None:
        sock = self._control.socket
        try:
            while not self._closed.is_set():
                if not sock.poll(100):
                    continue
                try:
                    msg = protocol.decode_incoming(sock.recv())
                except KrexError:
                    continue
                if isinstance(msg, protocol.Control):
                    self._on_control(msg)
        finally:
            self._control.close()

    def _on_control(self, msg: protocol.Control) -> None:
        if msg.kind == "drain":
            self.paused.set()
            for notice in list(self.waiting):  # stopped once we answer: say who we wait for now
                notice.say_now()
            devsync.synchronize_frameworks()
            for hook in self.drain_hooks:
                try:
                    hook()
                except Exception:
                    pass
            self._control.send(protocol.DrainAck(session=self.id, token=self.token, region=msg.region))
        elif msg.kind == "resume":
            self.paused.clear()
        elif msg.kind == "lease_expired":
            self.expired.add(msg.region)


_default: Session | None = None
_default_lock = threading.Lock()


def attach(gpu: int | None = None, name: str = "", role: str = "client", endpoint: str | None = None) -> Session:
    """Register this process as a session (once; later calls return the same session).

    ``gpu=None`` lets the arbiter place it (``KREX_GPU`` in the environment pins it).
    """
    global _default
    with _default_lock:
        if _default is not None and _default.owner_pid == os.getpid() and not _default._closed.is_set():
            if gpu is not None and gpu != _default.gpu:
                _default.close()
            else:
                return _default
        _default = Session(gpu=gpu, name=name, role=role, endpoint=endpoint)
        return _default


def current_session() -> Session | None:
    s = _default
    return s if s is not None and s.owner_pid == os.getpid() and not s._closed.is_set() else None


class RegionReport(dict[str, Any]):
    """What a region enforced (the arbiter's report), with a one-line summary."""

    def summary(self) -> str:
        if not self:
            return "region not granted"
        sim = " [simulated GPU]" if self.get("simulated") else ""
        parts = [
            f"KREX region {self.get('region')} on GPU {self.get('gpu')}{sim}"
            + (" (nested: the enclosing region's)" if self.get("nested") else "")
            + ":",
            # The caller's own wait where the client measured it (a caller stopped as another
            # region's intruder before it could queue waited longer than the queue saw).
            f"waited {self.get('caller_wait_s', self.get('wait_s', 0)) * 1e3:.1f} ms,"
            + (
                f" stopped {self['stopped_before_request_s'] * 1e3:.1f} ms by another region before it queued,"
                if self.get("stopped_before_request_s")
                else ""
            )
            + f" acquired in {self.get('acquire_s', 0) * 1e3:.1f} ms;",
            f"drained {len(self.get('drained', []))}, frozen {len(self.get('frozen', []))},"
            f" moved {len(self.get('moved', []))}, cores {self.get('cores', [])}",
        ]
        if "hold_s" in self:
            parts.append(f"; held {self['hold_s']:.3f} s")
        if self.get("not_drained"):
            parts.append(f"; NOT drained: {', '.join(self['not_drained'])}")
        if self.get("degraded"):
            # Say why (not-drained processes are named above): the first failure, and how many more.
            failures = [str(f) for f in self.get("failures", [])]
            why = f" ({failures[0]}{f'; {len(failures) - 1} more' if len(failures) > 1 else ''})" if failures else ""
            parts.append(f" - DEGRADED{why}")
        if self.get("expired"):
            parts.append(" - LEASE EXPIRED")
        if self.get("revoked"):
            parts.append(f" - {str(self.get('released_by', 'ended by admin')).upper()}")
        return " ".join(parts)


class Exclusive:
    """A region: the GPU alone for the code inside. Context manager (sync/async) and decorator."""

    def __init__(
        self,
        gpu: int | None = None,
        max_hold: float | None = None,
        freeze: bool = True,
        isolate: bool = True,
        cores: int | None = None,
        session: Session | None = None,
        exempt: Sequence[int] = (),
    ) -> None:
        self.options: dict[str, Any] = {
            "gpu": gpu,
            "max_hold": max_hold,
            "freeze": freeze,
            "isolate": isolate,
            "cores": cores,
            "exempt": list(exempt),
        }
        self._session = session
        self.id: str | None = None
        self.gpu: int | None = gpu
        self.report = RegionReport()
        self._cancel = threading.Event()
        #: inside a region this session already holds on the same GPU: granted at once, ended
        #: with the outer one
        self.nested = False

    @property
    def expired(self) -> bool:
        return bool(self.report.get("expired"))

    def acquire(self) -> Exclusive:
        called = time.monotonic()
        self.nested = False
        session = self._session
        if session is None:
            # A session holding a region keeps it (attach() to another GPU would end it): the
            # request names its GPU.
            current = current_session()
            session = current if current is not None and current.holds_any() else attach(self.options["gpu"])
        self._session = session
        gpu = session.gpu if self.options["gpu"] is None else self.options["gpu"]
        outer = session.holding(gpu)
        if outer is not None:  # `with exclusive(): with exclusive():` in one process
            self.id, self.gpu, self.nested = outer.id, gpu, True
            wait = round(time.monotonic() - called, 6)
            self.report = RegionReport({**outer.report, "nested": True, "caller_wait_s": wait})
            return self
        devsync.synchronize_frameworks()
        conn = session.connection()
        request = protocol.Acquire(session=session.id, token=session.token, **self.options)
        # A wait of more than a second says who holds the GPU and where the caller stands. Known
        # to the session before the request goes: a drain (this process about to be stopped as
        # an intruder in the region it waits behind) can arrive before the reply is read.
        notice = WaitNotice(functools.partial(status, session.endpoint, 5.0), gpu, session.id)
        session.waiting.add(notice)
        try:
            rid = conn.send(request)
        except BaseException:
            session.waiting.discard(notice)
            raise
        notice.start()
        try:
            granted: protocol.Granted = protocol.result_as(
                request, conn.wait(rid, timeout=None, cancelled=self._cancel)
            )
        except BaseException as exc:  # Ctrl-C or cancel while queued: withdraw the request
            if not isinstance(exc, KrexError) or isinstance(exc, RegionCancelled):
                self._withdraw(session, conn)
            raise
        finally:
            session.waiting.discard(notice)
            notice.stop()
        self.id = granted.region
        self.gpu = granted.gpu
        # What the caller waited, attaching included (the arbiter's wait_s is its queue's).
        self.report = RegionReport({**granted.report, "caller_wait_s": round(time.monotonic() - called, 6)})
        with session._held_lock:
            session._held[granted.gpu] = self
        return self

    def _withdraw(self, session: Session, conn: Connection) -> None:
        # We do not know the region id before the grant; releasing by session withdraws it.
        status_ = conn.call(protocol.Status(ticket=conn.ticket()), timeout=2.0)
        for g in status_["gpus"]:
            for r in ([g["holder"]] if g["holder"] else []) + g["queue"]:
                if r.get("session") == session.id:
                    try:
                        session.call(protocol.Release(region=r["region"]), timeout=5.0)
                    except KrexError:
                        pass

    def release(self) -> RegionReport:
        assert self._session is not None and self.id is not None, "release() before acquire()"
        if self.nested:  # the outer region ends it
            return self.report
        session = self._session
        try:
            result = session.call(protocol.Release(region=self.id), timeout=60.0)
        finally:
            with session._held_lock:
                if self.gpu is not None and session._held.get(self.gpu) is self:
                    del session._held[self.gpu]
        final = RegionReport(result or self.report)
        if "caller_wait_s" in self.report:
            final["caller_wait_s"] = self.report["caller_wait_s"]
        self.report = final
        return self.report

    def __enter__(self) -> Exclusive:
        return self.acquire()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        report = self.release()
        if report.get("expired") and et is None:
            raise LeaseExpired(
                f"region {self.id} exceeded max_hold={report.get('max_hold_s')} s and was released by the "
                "arbiter before the block ended: timings taken after that are not protected"
            )
        if report.get("revoked") and et is None:
            raise RegionRevoked(
                f"region {self.id} was {report.get('released_by')} after {report.get('hold_s', 0):.1f} s, before "
                "the block ended: timings taken after that are not protected"
            )

    async def __aenter__(self) -> Exclusive:
        try:
            return await asyncio.to_thread(self.acquire)
        except asyncio.CancelledError:
            self._cancel.set()
            raise

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.__exit__, et, ev, tb)

    def __call__(self, fn: F) -> F:
        if asyncio.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                async with Exclusive(**self.options, session=self._session):
                    return await fn(*args, **kwargs)

            return awrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with Exclusive(**self.options, session=self._session):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


def exclusive(
    gpu: int | None = None,
    max_hold: float | None = None,
    freeze: bool = True,
    isolate: bool = True,
    cores: int | None = None,
    exempt: Sequence[int] = (),
) -> Exclusive:
    """The GPU alone inside the block (or decorated function); ``region.report`` says what was enforced.

    ``exempt``: pids (with their trees) of this user that the region leaves running, such as
    the notebook waiting for this job's output.
    """
    return Exclusive(gpu=gpu, max_hold=max_hold, freeze=freeze, isolate=isolate, cores=cores, exempt=exempt)
