"""The client side: talk to the arbiter, register a session, hold regions.

    import krex_lab
    with krex_lab.exclusive(gpu=0) as region:   # attaches this process if it has not
        run_timing_loop()
    print(region.report.summary())

A :class:`Session` registers from a socket that a background thread then owns: the arbiter
sends it ``drain`` (the thread synchronises this process's GPU work, pauses and answers),
``resume`` and ``lease_expired``. Requests from user threads go through one socket per
thread (:class:`~krex_lab.connection.Connection`), each reply matched to its request by id;
what a region enforced comes back as a :class:`~krex_lab.region_report.RegionReport`.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import msgspec

from . import devsync, discovery, paths, protocol
from .connection import REQUEST_TIMEOUT, Connection, fetch_ticket, hello, status
from .errors import KrexError, LeaseExpired, RegionCancelled, RegionRevoked
from .region_report import RegionReport
from .wait_notice import WaitNotice, mark_cell_stderr

__all__ = [
    "REQUEST_TIMEOUT",
    "Connection",
    "Exclusive",
    "RegionReport",
    "Session",
    "attach",
    "current_session",
    "detach",
    "exclusive",
    "hello",
    "sessions",
    "status",
]

F = TypeVar("F", bound=Callable[..., Any])


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
        via_ticket: str = "",
    ) -> None:
        self.endpoint = endpoint or discovery.default_endpoint()
        self.name, self.role = name, role
        self.pid = pid or os.getpid()
        self.owner_pid = os.getpid()
        control_conn = Connection(self.endpoint)
        try:
            # A listener is there (Connection checked): a busy arbiter gets the time of any request.
            self.info: protocol.Info = control_conn.call(protocol.Hello())
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
                    via_ticket=via_ticket if within else "",
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
        #: when the last drain came (monotonic), and the last stop it began: (seconds, resumed at)
        self.drained_at: float | None = None
        self.last_stop: tuple[float, float] | None = None
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

    def stopped_until(self, when: float, within: float = 1.0) -> float:
        """Seconds this session's process was stopped by another's region up to ``when`` (monotonic),
        if that stop lasted until then or ended at most ``within`` seconds before: a stopped process
        starts nothing, so what it was asked meanwhile (a notebook's cell) waited that long."""
        drained = self.drained_at
        if self.paused.is_set() and drained is not None:
            return max(0.0, when - drained)
        last = self.last_stop
        if last is not None and when - last[1] <= within:
            return last[0]
        return 0.0

    def _on_control(self, msg: protocol.Control) -> None:
        if msg.kind == "drain":
            self.drained_at = time.monotonic()
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
            now = time.monotonic()
            if self.paused.is_set() and self.drained_at is not None:
                self.last_stop = (now - self.drained_at, now)
            self.paused.clear()
        elif msg.kind == "lease_expired":
            self.expired.add(msg.region)


_default: Session | None = None
#: sessions this process registered for other GPUs than its first one's (``attach(gpu=...)``)
_others: dict[int, Session] = {}
_default_lock = threading.Lock()


def _live(s: Session | None) -> Session | None:
    return s if s is not None and s.owner_pid == os.getpid() and not s._closed.is_set() else None


def attach(
    gpu: int | None = None, name: str = "", role: str = "client", endpoint: str | None = None, via_ticket: str = ""
) -> Session:
    """Register this process as a session (once; later calls return the same session).

    ``gpu=None`` lets the arbiter place it (``KREX_GPU`` in the environment pins it). A later call
    for another GPU registers a second session for that GPU (kept for later calls) and never
    moves the first: the process stays listed under its GPU, whose regions still drain and
    freeze it. ``via_ticket``: see :class:`krex_lab.protocol.Register` (a pool worker joining a
    client's region).
    """
    global _default
    with _default_lock:
        first = _live(_default)
        if first is None:
            _others.clear()  # a closed first session, or a forked child's inherited ones
            mark_cell_stderr()  # in a notebook: the processes it starts keep their waits to one line
            _default = Session(gpu=gpu, name=name, role=role, endpoint=endpoint, via_ticket=via_ticket)
            return _default
        if gpu is None or gpu == first.gpu:
            return first
        other = _live(_others.get(gpu))
        if other is None:
            other = _others[gpu] = Session(
                gpu=gpu, name=name or first.name, role=first.role, endpoint=endpoint or first.endpoint
            )
        return other


def current_session() -> Session | None:
    """This process's first session (the one :func:`attach` placed), if it is open."""
    return _live(_default)


def sessions() -> list[Session]:
    """Every open session of this process: the first, then those for other GPUs."""
    first = current_session()
    return [first, *filter(None, map(_live, _others.values()))] if first is not None else []


def detach() -> None:
    """Close this process's sessions (the arbiter forgets them; the next :func:`attach` registers anew)."""
    global _default
    with _default_lock:
        for s in [*_others.values(), *([_default] if _default is not None else [])]:
            s.close()
        _others.clear()
        _default = None


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
        #: what the region is asked to be (carried as it is to the arbiter's Region)
        self.spec = protocol.RegionSpec(
            gpu=gpu, max_hold=max_hold, freeze=freeze, isolate=isolate, cores=cores, exempt=list(exempt)
        )
        self._session = session
        self.id: str | None = None
        self.gpu: int | None = gpu
        self.report: RegionReport = RegionReport()
        self._cancel = threading.Event()
        #: inside a region this session already holds on the same GPU: granted at once, ended
        #: with the outer one
        self.nested = False
        #: end the session with the region (``krex exclusive``: the process exits next)
        self.leave = False
        #: what the region protects, as its cut-short message names it ("the block ended")
        self.protects = "block"

    @classmethod
    def of(cls, spec: protocol.RegionSpec, session: Session | None = None) -> Exclusive:
        """A region as ``spec`` says (each call of a decorated function gets its own)."""
        return cls(**msgspec.structs.asdict(spec), session=session)

    @property
    def expired(self) -> bool:
        return self.report.expired

    def acquire(self) -> Exclusive:
        called = time.monotonic()
        self.nested = False
        session = self._session
        if session is None:
            # This process's session, wherever it is: the request names the GPU, and a region on
            # another GPU never moves the session (it stays under its own GPU's regions).
            session = current_session() or attach(self.spec.gpu)
        self._session = session
        gpu = session.gpu if self.spec.gpu is None else self.spec.gpu
        outer = session.holding(gpu)
        if outer is not None:  # `with exclusive(): with exclusive():` in one process
            self.id, self.gpu, self.nested = outer.id, gpu, True
            wait = round(time.monotonic() - called, 6)
            self.report = msgspec.structs.replace(outer.report, nested=True, caller_wait_s=wait)
            return self
        devsync.synchronize_frameworks()
        conn = session.connection()
        request = protocol.Acquire.asking(self.spec, session=session.id, token=session.token)
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
        got = False
        try:
            granted: protocol.Granted = protocol.result_as(
                request, conn.wait(rid, timeout=None, cancelled=self._cancel, slow=(notice.delay, notice.start))
            )
            got = True
        except BaseException as exc:  # Ctrl-C or cancel while queued: withdraw the request
            if not isinstance(exc, KrexError) or isinstance(exc, RegionCancelled):
                self._withdraw(session, conn)
            raise
        finally:
            session.waiting.discard(notice)
            notice.stop(granted=got)
        self.id = granted.region
        self.gpu = granted.gpu
        # What the caller waited, attaching included (the arbiter's wait_s is its queue's).
        self.report = msgspec.structs.replace(granted.report, caller_wait_s=round(time.monotonic() - called, 6))
        with session._held_lock:
            session._held[granted.gpu] = self
        return self

    def _withdraw(self, session: Session, conn: Connection) -> None:
        # We do not know the region id before the grant; releasing by session withdraws it.
        from .node_status import NodeStatus

        table = NodeStatus.of(conn.call(protocol.Status(ticket=conn.ticket()), timeout=2.0))
        for g in table.gpus:
            for r in ([g.holder] if g.holder else []) + g.queue:
                if r.session == session.id:
                    try:
                        session.call(protocol.Release(region=r.region), timeout=5.0)
                    except KrexError:
                        pass

    def release(self) -> RegionReport:
        assert self._session is not None and self.id is not None, "release() before acquire()"
        if self.nested:  # the outer region ends it
            return self.report
        session = self._session
        try:
            result = session.call(protocol.Release(region=self.id, leave=self.leave), timeout=60.0)
        finally:
            with session._held_lock:
                if self.gpu is not None and session._held.get(self.gpu) is self:
                    del session._held[self.gpu]
        final: RegionReport = result if result.region else self.report
        self.report = msgspec.structs.replace(final, caller_wait_s=self.report.caller_wait_s)
        return self.report

    def __enter__(self) -> Exclusive:
        return self.acquire()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        report = self.release()
        why = report.cut_short(self.protects)
        if why and et is None:
            raise (LeaseExpired if report.expired else RegionRevoked)(why)

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
                async with Exclusive.of(self.spec, self._session):
                    return await fn(*args, **kwargs)

            return awrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with Exclusive.of(self.spec, self._session):
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
