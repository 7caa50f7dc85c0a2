"""Job and result types, and the wire formats of the pool.

Client <-> pool (ZeroMQ DEALER/ROUTER, one msgpack map per message):

* client: ``{"op": "submit", "rid", "pid", "job": {kind, gpu, lease, exclusive, timeout, ...}}``;
  ``{"op": "interrupt", "job", "force"}``, ``{"op": "release", "lease"}``, ``{"op": "status"}``,
  ``{"op": "ping"}``.
* pool: ``{"rid", "kind": "accepted", "job"}``, then any number of
  ``{"rid", "kind": "output", "stream": "stdout"|"stderr", "text"}`` while the job runs, then
  exactly one ``{"rid", "kind": "result", "result": {...JobResult...}}``. Errors of a request:
  ``{"rid", "kind": "error", "message"}``.

Pool <-> worker: length-prefixed msgpack frames over a socketpair (:func:`pack`,
:func:`read_frame`); the worker's stdout and stderr are plain pipes the pool reads.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import msgspec

from .. import paths
from ..errors import KrexError

#: exit status a shell reports for a job that ran past its timeout (as GNU ``timeout`` does)
TIMEOUT_EXIT = 124
#: exit status of a script stopped by KeyboardInterrupt (a shell shows 128 + SIGINT)
INTERRUPT_EXIT = 128 + signal.SIGINT

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(dict)
_HEADER = struct.Struct(">I")


class PoolUnavailable(KrexError):
    """No pool answers at the endpoint (and none could be started)."""


class RemoteError(KrexError):
    """A job failed in its worker; ``traceback`` is the remote traceback (or the worker's last stderr)."""

    def __init__(self, message: str, traceback: str | None = None, result: JobResult | None = None) -> None:
        super().__init__(message)
        self.traceback = traceback
        self.result = result

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base}\n{self.traceback}" if self.traceback else base


class WorkerDied(RemoteError):
    """The worker running the job died (segfault, ``os._exit``, killed)."""


class JobTimeout(RemoteError):
    """The job ran past its timeout."""


class RemoteTraceback(Exception):
    """Set as ``__cause__`` of a re-raised remote exception, so that printing it shows where it failed."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb.rstrip()}\n"""'


@dataclass
class JobResult:
    """What one job gave: exactly one per job, whatever happened to its worker.

    ``ok``: the job finished normally (no exception, exit code 0 or none). ``exit_code``: for
    scripts always set, as ``python SCRIPT.py`` would exit (exception: 1, KeyboardInterrupt: 130,
    killed by signal N: 128 + N, timeout: 124); for code and calls only on SystemExit or a worker
    that exited. ``error``: one short line saying what went wrong. ``traceback``: the remote
    traceback as Python prints it (for a dead worker: its last lines of stderr). ``value``: the
    function's return value for :meth:`PoolClient.call`; for :meth:`PoolClient.run_code` the
    ``repr`` of the cell's last expression (like a notebook's ``Out``), else None.
    """

    ok: bool
    exit_code: int | None = None
    error: str | None = None
    traceback: str | None = None
    value: Any = None
    worker_pid: int | None = None
    job_id: str | None = None
    gpu: int | None = None
    #: "ok", "exception", "exit", "interrupted", "timeout", "died", "cancelled"
    status: str = "ok"
    #: wall-clock times (pool's clock, seconds since the epoch): submitted, sent to a worker, finished
    submitted_at: float | None = None
    dispatched_at: float | None = None
    finished_at: float | None = None
    #: the region report when the job ran with ``exclusive=True``
    region: dict[str, Any] | None = None
    #: something the caller should know (e.g. a lease whose worker died and was replaced)
    notice: str | None = None
    #: for call(): the pickled exception (internal; PoolClient.call re-raises it)
    exc_pickle: bytes | None = field(default=None, repr=False)

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> JobResult:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def encode(msg: Any) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes) -> dict[str, Any]:
    msg: dict[str, Any] = _decoder.decode(data)
    return msg


def pack(msg: dict[str, Any]) -> bytes:
    body = _encoder.encode(msg)
    return _HEADER.pack(len(body)) + body


def recv_frame(sock: socket.socket) -> dict[str, Any] | None:
    """Blocking read of one frame from a socketpair; None at EOF."""
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    body = _recv_exact(sock, size)
    return None if body is None else decode(body)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


async def read_frame(reader: Any) -> dict[str, Any] | None:
    """Asyncio read of one frame (``reader`` is an asyncio.StreamReader); None at EOF."""
    import asyncio

    try:
        header = await reader.readexactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        return decode(await reader.readexactly(size))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


_SIGNAL_WORDS = {
    "SIGSEGV": "segmentation fault",
    "SIGBUS": "bus error",
    "SIGFPE": "floating-point exception",
    "SIGILL": "illegal instruction",
    "SIGABRT": "aborted",
    "SIGKILL": "killed",
    "SIGTERM": "terminated",
    "SIGINT": "interrupted",
    "SIGHUP": "hangup",
    "SIGPIPE": "broken pipe",
}


def describe_exit(returncode: int) -> str:
    """``-11`` -> ``"SIGSEGV (segmentation fault)"``, ``3`` -> ``"exited with code 3"``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            return f"killed by signal {-returncode}"
        word = _SIGNAL_WORDS.get(name)
        return f"{name} ({word})" if word else name
    return f"exited with code {returncode}"


def shell_status(returncode: int) -> int:
    """The exit status a shell shows for a process that ended with ``returncode`` (Popen's)."""
    return 128 - returncode if returncode < 0 else returncode


def default_endpoint() -> str:
    """``KREX_POOL_ENDPOINT`` when set, else ``ipc://<runtime dir>/pool.sock`` (this user's, 0700)."""
    return os.environ.get(paths.POOL_ENDPOINT_ENV) or f"ipc://{paths.runtime_dir() / 'pool.sock'}"


def ipc_path(endpoint: str) -> str | None:
    return endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None


def lock_path(endpoint: str) -> str | None:
    """The lock file a pool holds while it serves an ipc endpoint (clients test it to skip pinging)."""
    path = ipc_path(endpoint)
    return None if path is None else path + ".lock"
