"""Talk to this user's pool: run code, functions and scripts on warm context workers.

    from krex_lab.workers.client import PoolClient
    pool = PoolClient.connect()                 # starts a pool on demand if none answers
    r = pool.run_script("bench.py", ["--n", "4096"], on_output=lambda s, t: print(t, end=""))
    r.exit_code, r.error, r.traceback
    pool.call(fn, x, gpu=0)                     # fn's return value, or its exception re-raised
    krex_lab.submit(fn, x)                      # a concurrent.futures.Future

Every request is a struct of :mod:`krex_lab.workers.wire`; an error the pool raises is re-raised
here as its class (:func:`krex_lab.errors.error_from_wire`).

**Nothing is sent to a pool the kernel has not vouched for.** Before each socket connects (one
per thread), the ``ipc://`` endpoint is checked (:mod:`.trust`): the socket file and every
directory above it are this user's or root's (a sticky shared directory only with the file this
user's), and the process listening there has this user's uid (``SO_PEERCRED``). Otherwise
:class:`PoolUnavailable` is raised (marked :func:`~.trust.untrusted`), nothing was sent, no
pool is started on demand there, and nothing it could return is ever unpickled. ``tcp://`` is
refused unless ``allow_tcp`` (or ``KREX_POOL_ALLOW_TCP=1``).

Each thread uses its own DEALER socket, so one client serves many threads (``submit`` runs
each call in a thread of a shared executor). A job's output arrives while it runs and is handed
to ``on_output(stream, text)`` (default: this process's stdout/stderr). Ctrl-C while waiting
interrupts the remote job (KeyboardInterrupt in it; the worker survives); a second Ctrl-C kills
its worker; a third gives up waiting.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq

from ... import paths, protocol
from ...errors import JobTimeout, KrexError, PoolUnavailable, RemoteError, WorkerDied, error_from_wire
from ...protocol import Request
from ..endpoint import default_endpoint, ipc_path
from ..results import JobResult, RemoteTraceback
from ..wire import (
    Accepted,
    Interrupt,
    JobSpec,
    Output,
    Ping,
    PoolInfo,
    PoolStatus,
    PoolTable,
    ReleaseLease,
    Size,
    Sized,
    Submit,
    decode_incoming,
)
from .fast_run import pool_died_line
from .on_demand import lock_free, start_pool, started_line
from .region_claim import region_claim
from .stdin import STDIN_LIMIT, read_stdin
from .trust import PoolPeer, is_untrusted, tcp_allowed, untrusted, verify_ipc_endpoint

if TYPE_CHECKING:
    import concurrent.futures

__all__ = [
    "STDIN_LIMIT",
    "OutputFn",
    "PoolClient",
    "default_client",
    "exception_of",
    "print_output",
    "read_stdin",
    "submit",
]

OutputFn = Callable[[str, str], None]


def print_output(stream: str, text: str) -> None:
    """The default ``on_output``: write to this process's stdout or stderr, as it arrives."""
    target = sys.stderr if stream == "stderr" else sys.stdout
    target.write(text)
    target.flush()


class PoolClient:
    """A connection to this user's pool service (see :meth:`connect`)."""

    def __init__(self, endpoint: str | None = None, *, allow_tcp: bool | None = None) -> None:
        self.endpoint = endpoint or default_endpoint()
        self.allow_tcp = tcp_allowed(allow_tcp)
        self.info: PoolInfo | None = None
        self.peer: PoolPeer | None = None  # the listener, as the kernel described it (ipc)
        self._local = threading.local()
        self._sockets: list[zmq.Socket[bytes]] = []
        self._lock = threading.Lock()
        self._closed = False
        #: the pool this client started on demand (its pid), None where one already answered
        self.started_pid: int | None = None

    @classmethod
    def connect(cls, endpoint: str | None = None, start: bool = True, *, allow_tcp: bool | None = None) -> PoolClient:
        """The pool at ``endpoint`` (default: ``KREX_POOL_ENDPOINT``, else this user's runtime dir).

        With ``start`` a pool is started on demand (detached; it exits after its idle time) when
        none answers. Raises :class:`PoolUnavailable` otherwise, and also (nothing sent, nothing
        started) when the endpoint is served by, or could be swapped by, another user.
        """
        client = cls(endpoint, allow_tcp=allow_tcp)
        try:
            client.verify()
            if lock_free(client.endpoint):
                raise PoolUnavailable("no pool holds its lock")
            client.info = client._request(Ping(), timeout=2.0)
        except PoolUnavailable as exc:
            if is_untrusted(exc):  # another user's endpoint: nothing sent, nothing started
                client.close()
                raise
            if not start:
                client.close()
                raise PoolUnavailable(
                    f"no KREX pool answers at {client.endpoint} ({exc}); start one with "
                    "`krex pool`, or let `krex run` start it"
                ) from None
            client._start_pool()
        if client.info is not None and client.info.uid != os.getuid():
            client.close()
            raise PoolUnavailable(f"the pool at {client.endpoint} belongs to uid {client.info.uid}, not you")
        return client

    # -- plumbing ---------------------------------------------------------------------------------
    def verify(self) -> PoolPeer | None:
        """Ask the kernel who serves the endpoint; raises unless it is this user (see :mod:`.trust`).

        :class:`PoolUnavailable`, marked :func:`~.trust.untrusted` when another user serves it or
        could swap it, unmarked when nobody listens there. Returns the listener (None for tcp)."""
        path = ipc_path(self.endpoint)
        if path is None:
            if self.endpoint.startswith("tcp://") and self.allow_tcp:
                return None
            raise untrusted(
                f"refusing to talk to a pool at {self.endpoint}: no kernel can say who serves "
                "it, and whoever does would run your code and hand back objects this process "
                "unpickles; nothing was sent. Use an ipc:// endpoint, or allow_tcp=True "
                "(KREX_POOL_ALLOW_TCP=1) if the network is yours alone."
            )
        self.peer = verify_ipc_endpoint(path)
        return self.peer

    def _socket(self) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] | None = getattr(self._local, "socket", None)
        if sock is None:
            if self._closed:
                raise PoolUnavailable("this PoolClient is closed")
            peer = self.verify()  # every socket, right before it connects: nothing reaches a foreign pool
            sock = zmq.Context.instance().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            if peer is not None and peer.shared_dir:
                # In a shared (sticky) directory another user may bind the path once this pool is
                # gone: never reconnect to it unchecked (a new socket is checked again).
                sock.setsockopt(zmq.RECONNECT_IVL, -1)
            sock.connect(self.endpoint)
            self._local.socket = sock
            with self._lock:
                self._sockets.append(sock)
        return sock

    def _pool_alive(self) -> bool:
        pid = self.peer.pid if self.peer is not None else self.info.pid if self.info is not None else None
        return pid is None or os.path.exists(f"/proc/{pid}")

    def _request(self, request: Request, timeout: float = 10.0) -> Any:
        """Send ``request``, wait for its reply: the result as ``request.reply`` says, or its error raised."""
        sock = self._socket()
        request.id = _rid()
        sock.send(protocol.encode(request))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sock.poll(100):
                msg = decode_incoming(sock.recv())
                if msg.id != request.id or not isinstance(msg, protocol.Reply):
                    continue  # a late message of an abandoned request
                return _result(request, msg)
            if not self._pool_alive():
                break
        self._drop_socket()  # a pool that restarted is checked again before anything is sent to it
        raise PoolUnavailable(f"no reply from the pool at {self.endpoint} within {timeout:g} s")

    def _start_pool(self) -> None:
        """Start a detached pool on demand (:mod:`.on_demand`) and wait until it answers."""

        def answers() -> PoolInfo | None:
            if lock_free(self.endpoint):
                return None
            try:
                return self._request(Ping(), timeout=1.0)
            except PoolUnavailable as exc:
                if is_untrusted(exc):  # someone else bound the endpoint first: never talk to it
                    raise
                self._drop_socket()  # not listening yet: the next try checks (and connects) afresh
                return None

        info, pid, log = start_pool(self.endpoint, answers)
        self.info = info
        if info.pid == pid:  # ours (not one that won a race): say it, once
            self.started_pid = pid
            self._say_started(log)

    def _say_started(self, log: Path) -> None:
        """One line on stderr: a pool now runs in the background, how long it stays, how to stop it."""
        assert self.info is not None
        if paths.quiet():
            return
        try:
            idle = self.status().pool.idle_exit_s
        except (KrexError, KeyError, TypeError, ValueError):
            idle = 0.0
        print(started_line(self.info.pid, log, idle), file=sys.stderr, flush=True)

    def _drop_socket(self) -> None:
        """Forget this thread's socket (the next request checks the endpoint again)."""
        sock: zmq.Socket[bytes] | None = getattr(self._local, "socket", None)
        if sock is not None:
            self._local.socket = None
            with self._lock:
                if sock in self._sockets:
                    self._sockets.remove(sock)
            with contextlib.suppress(Exception):
                sock.close(linger=0)

    def _run(self, job: JobSpec, on_output: OutputFn | None, watch: Callable[[], int] | None = None) -> JobResult:
        """Submit one job, stream its output, return its one result (the submit's reply).

        ``watch``: asked every 50 ms while the job runs; 1 interrupts the job (KeyboardInterrupt
        in it), 2 kills its worker, as a first and a second Ctrl-C would (each sent once)."""
        out = on_output or print_output
        sock = self._socket()
        region, ticket = region_claim(job.gpu)
        submit = Submit(id=_rid(), pid=os.getpid(), job=job, region=region, region_ticket=ticket)
        sock.send(protocol.encode(submit))
        job_id: str | None = None
        interrupts = 0
        watched = 0

        def interrupt(force: bool) -> None:
            sock.send(protocol.encode(Interrupt(id=_rid(), job=job_id, target=submit.id, force=force)))

        while True:
            try:
                if watch is not None:
                    action = watch()
                    if action > watched:
                        watched = action
                        interrupt(action >= 2)
                if sock.poll(50 if watch is not None else 200):
                    msg = decode_incoming(sock.recv())
                    if msg.id != submit.id:
                        continue  # a late message of an abandoned job, or an interrupt's reply
                    if isinstance(msg, Output):
                        try:
                            out(msg.stream, msg.text)
                        except Exception:  # nobody to write to (a closed pipe): the job ends too
                            interrupt(True)
                            raise
                    elif isinstance(msg, Accepted):
                        job_id = msg.job
                    else:
                        result: JobResult = _result(submit, msg)
                        return result
                elif not self._pool_alive():
                    self._drop_socket()  # the next request checks the endpoint afresh
                    return JobResult(
                        ok=False,
                        status="died",
                        job_id=job_id,
                        exit_code=1 if job.kind == "script" else None,
                        error=pool_died_line(self.info.pid if self.info else "?"),
                    )
            except KeyboardInterrupt:
                interrupts += 1
                if interrupts >= 3:
                    raise
                interrupt(interrupts >= 2)

    # -- the interface ------------------------------------------------------------------------------
    def run_code(
        self,
        code: str,
        *,
        gpu: int | None = None,
        lease: str | None = None,
        exclusive: bool = False,
        timeout: float | None = None,
        on_output: OutputFn | None = None,
    ) -> JobResult:
        """Run ``code`` like a notebook cell. With ``lease`` the namespace persists across calls (the
        same worker serves the lease until :meth:`release_lease` or its idle timeout); without, each
        call starts from an empty namespace. ``value`` is the repr of the last expression."""
        return self._run(
            JobSpec(kind="code", code=code, gpu=gpu, lease=lease, exclusive=exclusive, timeout=timeout), on_output
        )

    def release_lease(self, lease: str) -> None:
        """End a lease: its worker's namespace is cleared and GPU memory checked, then it serves others."""
        self._request(ReleaseLease(lease=lease))

    def run_script(
        self,
        path: str | os.PathLike[str],
        argv: Sequence[str] = (),
        *,
        gpu: int | None = None,
        exclusive: bool = False,
        cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        on_output: OutputFn | None = None,
        stdin: bytes | None = None,
    ) -> JobResult:
        """Run a script as ``python PATH ARGV...`` would (runpy, ``__main__``); ``env`` replaces the
        environment for the run (the worker's GPU placement variables stay). ``exit_code`` is set.
        ``stdin``: what the script reads from its stdin (fd 0; :func:`read_stdin` gives this
        process's); None: ``/dev/null``."""
        cwd_s = os.fspath(cwd) if cwd is not None else os.getcwd()
        return self._run(
            JobSpec(
                kind="script",
                path=os.path.join(cwd_s, os.fspath(path)),
                argv=[str(a) for a in argv],
                cwd=cwd_s,
                env=env,
                gpu=gpu,
                exclusive=exclusive,
                timeout=timeout,
                stdin=stdin,
            ),
            on_output,
        )

    def call(self, fn: Callable[..., Any], *args: Any, gpu: int | None = None, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on a worker (cloudpickle). Returns its value or raises its exception
        (with the remote traceback as ``__cause__``); :class:`WorkerDied`, :class:`JobTimeout` or
        :class:`RemoteError` when there is no exception to re-raise."""
        import cloudpickle

        payload = cloudpickle.dumps((fn, args, kwargs))
        result = self._run(JobSpec(kind="call", payload=payload, gpu=gpu), None)
        if result.ok:
            return cloudpickle.loads(result.value)
        raise exception_of(result)

    def size(self, per_gpu: int, cap: bool = False) -> int:
        """Ask the pool to keep ``per_gpu`` active workers on every GPU while this process lives
        (0: no more); returns what it keeps now (within its ``max_workers_per_gpu``). ``cap``: let
        it keep at most ``per_gpu`` workers per GPU, spares included (0: lift the cap)."""
        sized: Sized = self._request(Size(per_gpu=per_gpu, pid=os.getpid(), cap=cap))
        return sized.per_gpu

    def status(self) -> PoolTable:
        """Workers per GPU (state, pid, lease, jobs run), gates, queue, leases, counters."""
        status: PoolTable = self._request(PoolStatus())
        return status

    def close(self) -> None:
        self._closed = True
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(Exception):
                    sock.close(linger=0)
            self._sockets.clear()
        self._local = threading.local()

    def __enter__(self) -> PoolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def exception_of(result: JobResult) -> BaseException:
    """The exception a failed call stands for: the remote one if it unpickles, else a RemoteError."""
    if result.exc_pickle:
        try:
            import cloudpickle

            exc: BaseException = cloudpickle.loads(result.exc_pickle)
            if result.traceback:
                exc.__cause__ = RemoteTraceback(result.traceback)
            return exc
        except Exception:
            pass
    message = result.error or "the job failed"
    if result.status == "died":
        return WorkerDied(message, result.traceback, result)
    if result.status == "timeout":
        return JobTimeout(message, result.traceback, result)
    return RemoteError(message, result.traceback, result)


def _rid() -> int:
    """A request id no other thread or process of this user will pick (63 random bits)."""
    return int.from_bytes(os.urandom(8), "big") >> 1


def _result(request: Request, reply: protocol.Reply) -> Any:
    """The reply's result as ``request.reply`` says, or the error it carries, raised as its class."""
    if reply.error is not None:
        raise error_from_wire(reply.error.type, reply.error.message, reply.error.traceback)
    return protocol.result_as(request, reply.result)


_default: PoolClient | None = None
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_default_lock = threading.Lock()


def default_client() -> PoolClient:
    """The process-wide PoolClient (connected on first use, starting a pool on demand)."""
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            _default = PoolClient.connect()
        return _default


def submit(fn: Callable[..., Any], *args: Any, gpu: int | None = None, **kwargs: Any) -> concurrent.futures.Future[Any]:
    """Run ``fn(*args, **kwargs)`` on a warm context worker; a Future of its value (or exception)."""
    global _executor
    import concurrent.futures

    client = default_client()
    with _default_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="krex-submit")
    return _executor.submit(client.call, fn, *args, gpu=gpu, **kwargs)
