"""What a job gives back, shared by the pool, its workers and its clients.

:class:`JobResult` crosses both links as a msgspec struct (pool -> client as the ``result`` of
the ``submit`` reply, worker -> pool inside ``done``); the rest is how an exit status reads: the
status a shell would show, and a signal's name in words.
"""

from __future__ import annotations

import signal
from typing import Any

import msgspec

from ..region_report import RegionReport

#: exit status a shell reports for a job that ran past its timeout (as GNU ``timeout`` does)
TIMEOUT_EXIT = 124
#: exit status of a script stopped by KeyboardInterrupt (a shell shows 128 + SIGINT)
INTERRUPT_EXIT = 128 + signal.SIGINT

#: what ``status`` may say
STATUSES = ("ok", "exception", "exit", "interrupted", "timeout", "died", "cancelled", "failed")


class JobResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What one job gave: exactly one per job, whatever happened to its worker.

    ``ok``: the job finished normally (no exception, exit code 0 or none). ``exit_code``: for
    scripts always set, as ``python SCRIPT.py`` would exit (exception: 1, KeyboardInterrupt: 130,
    killed by signal N: 128 + N, timeout: 124); for code and calls only on SystemExit or a worker
    that exited. ``error``: one short line saying what went wrong. ``traceback``: the remote
    traceback as Python prints it (for a dead worker: its last lines of stderr). ``value``: the
    function's return value (pickled) for :meth:`PoolClient.call`; for :meth:`PoolClient.run_code`
    the ``repr`` of the cell's last expression (like a notebook's ``Out``), else None.
    """

    ok: bool
    exit_code: int | None = None
    error: str | None = None
    traceback: str | None = None
    value: Any = None
    worker_pid: int | None = None
    job_id: str | None = None
    gpu: int | None = None
    #: one of :data:`STATUSES`
    status: str = "ok"
    #: wall-clock times (pool's clock, seconds since the epoch): submitted, sent to a worker, finished
    submitted_at: float | None = None
    dispatched_at: float | None = None
    finished_at: float | None = None
    #: the region report when the job ran with ``exclusive=True``
    region: RegionReport | None = None
    #: something the caller should know (e.g. a lease whose worker died and was replaced)
    notice: str | None = None
    #: for call(): the pickled exception (PoolClient.call re-raises it)
    exc_pickle: bytes | None = None


class RemoteTraceback(Exception):
    """Set as ``__cause__`` of a re-raised remote exception, so that printing it shows where it failed."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb.rstrip()}\n"""'


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
