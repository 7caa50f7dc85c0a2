"""Job and result types, and the wire formats of the pool.

Client <-> pool (ZeroMQ DEALER/ROUTER, one msgpack map per message):

Each message is a JSON object (frame 1) plus one frame per binary value (:func:`encode`).

* client: ``{"op": "submit", "rid", "pid", "job": {kind, gpu, lease, exclusive, timeout, ...}}``;
  ``{"op": "interrupt", "job", "force"}``, ``{"op": "release", "lease"}``, ``{"op": "status"}``,
  ``{"op": "ping"}``.
* pool: ``{"rid", "kind": "accepted", "job"}``, then any number of
  ``{"rid", "kind": "output", "stream": "stdout"|"stderr", "text"}`` while the job runs, then
  exactly one ``{"rid", "kind": "result", "result": {...JobResult...}}``. Errors of a request:
  ``{"rid", "kind": "error", "message"}``.

Pool <-> worker: length-prefixed msgpack frames over a socketpair (:mod:`.wire`); the worker's
stdout and stderr are plain pipes the pool reads.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .. import paths
from ..errors import KrexError

#: exit status a shell reports for a job that ran past its timeout (as GNU ``timeout`` does)
TIMEOUT_EXIT = 124
#: exit status of a script stopped by KeyboardInterrupt (a shell shows 128 + SIGINT)
INTERRUPT_EXIT = 128 + signal.SIGINT

_BLOB = "__krex_frame__"


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


def encode(msg: dict[str, Any]) -> list[bytes]:
    """A client-protocol message as ZeroMQ frames: a JSON header, then one frame per bytes value.

    JSON and not msgpack here so that a client (``krex run`` above all) starts without
    importing msgspec: its start-up is on every command's critical path.
    """
    blobs: list[bytes] = []

    def strip(value: Any) -> Any:
        if isinstance(value, (bytes, bytearray, memoryview)):
            blobs.append(bytes(value))
            return {_BLOB: len(blobs)}
        if isinstance(value, dict):
            return {str(k): strip(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [strip(v) for v in value]
        return value

    header = json.dumps(strip(msg), ensure_ascii=False, separators=(",", ":")).encode()
    return [header, *blobs]


def decode(frames: list[bytes]) -> dict[str, Any]:
    """The inverse of :func:`encode`; raises ValueError on a malformed message."""
    blobs = frames[1:]

    def fill(value: Any) -> Any:
        if isinstance(value, dict):
            if len(value) == 1 and _BLOB in value:
                return blobs[int(value[_BLOB]) - 1]
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        return value

    try:
        msg = fill(json.loads(frames[0]))
    except (IndexError, TypeError, KeyError) as exc:
        raise ValueError(f"malformed message: {exc}") from None
    if not isinstance(msg, dict):
        raise ValueError("a message is a JSON object")
    return msg


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
