"""The errors KREX raises, one hierarchy for every process and every link.

    KrexError                       anything KREX reports
    ├── ArbiterUnavailable          no arbiter answers at the endpoint (says how to start one)
    ├── PoolUnavailable             no pool answers (and none could be started), or it is not yours
    ├── ProtocolError               a message broke the protocol (bad bytes, schema, version, size)
    ├── RequestRejected             a server refused a well-formed request
    │   ├── PermissionDenied        the request touches another user's process or region
    │   ├── NotHolder               release of a region this session does not hold
    │   ├── UnknownSession          the session id/token is not (or no longer) registered
    │   ├── InvalidRequest          a value is out of range (a GPU that does not exist, ...)
    │   └── QuotaExceeded           a per-user, per-process or node limit refused it (the message names it)
    ├── LeaseExpired                the region was force-released at its max_hold
    ├── RegionRevoked               an admin ended the region before its holder did
    ├── RegionCancelled             the request was withdrawn or the arbiter shut down before grant
    ├── BackendError                the GPU backend failed (driver, NVML, amdsmi)
    ├── MissingDependency           an optional package a feature needs is not installed (also an ImportError)
    └── RemoteError                 a job failed in its context worker (``traceback``: the remote one)
        ├── WorkerDied              the worker running the job died (segfault, ``os._exit``, killed)
        └── JobTimeout              the job ran past its timeout

Every error a server (arbiter or pool) sends carries the name of its class, so a client
re-raises the very class the server meant (:func:`error_from_wire`); the name map is derived
from the classes below, so a new class crosses the wire the moment it is defined here.
"""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` costs every command's start; the checker alone reads Any
if TYPE_CHECKING:
    from typing import Any


class KrexError(Exception):
    """Base of every KREX error."""


class ArbiterUnavailable(KrexError):
    """No arbiter answered at the endpoint."""


class PoolUnavailable(KrexError):
    """No pool answers at the endpoint (and none could be started), or it belongs to another user."""


class ProtocolError(KrexError):
    """A message that breaks the protocol."""


class RequestRejected(KrexError):
    """A well-formed request the server refused."""


class PermissionDenied(RequestRejected):
    """The request concerns a process or region of another user."""


class NotHolder(RequestRejected):
    """Release or renewal of a region that the session does not hold."""


class UnknownSession(RequestRejected):
    """The session is not registered (it ended, or the token is wrong)."""


class InvalidRequest(RequestRejected):
    """A request whose values are out of range."""


class QuotaExceeded(RequestRejected):
    """A limit (sessions, queued requests, hold time per user or process; the node's capacity)
    refused the request; the message names the limit and its value."""


class LeaseExpired(KrexError):
    """The region outlived its ``max_hold`` and was released by the arbiter."""


class RegionRevoked(KrexError):
    """An admin ended the region (``Release(force=True)``) before its block ended."""


class RegionCancelled(KrexError):
    """The region was never granted: cancelled, or the arbiter went away."""


class BackendError(KrexError):
    """The GPU backend failed."""


class MissingDependency(KrexError, ImportError):
    """A package a feature needs (torch for ``bench(framework="torch")``, ipywidgets for the
    dashboard, ...) is not installed; the message names it and the command that installs it.
    Also an ``ImportError``, so code that already catches that keeps working."""

    @classmethod
    def of(cls, package: str, feature: str, install: str, cause: BaseException | None = None) -> MissingDependency:
        """The error for ``feature`` needing ``package``; ``cause`` (the ImportError seen) adds what failed."""
        seen = f" ({cause})" if cause is not None and str(cause) and package not in str(cause) else ""
        return cls(f"{feature} needs {package}, which is not installed here{seen}: {install}", name=package)


class RemoteError(KrexError):
    """A job failed in its worker; ``traceback`` is the remote traceback (or the worker's last stderr),
    ``result`` the job's :class:`~krex_lab.workers.results.JobResult` when there is one."""

    def __init__(self, message: str, traceback: str | None = None, result: Any = None) -> None:
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


def _descendants(cls: type[KrexError]) -> list[type[KrexError]]:
    found = [cls]
    for sub in cls.__subclasses__():
        found.extend(_descendants(sub))
    return found


def error_classes() -> dict[str, type[KrexError]]:
    """Every error class that may cross a link, by name (this module's classes only: a subclass
    defined elsewhere must not shadow one of these)."""
    return {c.__name__: c for c in _descendants(KrexError) if c.__module__ == __name__}


_BY_NAME = error_classes()


def error_from_wire(type_name: str, message: str, traceback: str | None = None) -> KrexError:
    """The exception an error reply stands for (unknown names fall back to :class:`KrexError`)."""
    cls = _BY_NAME.get(type_name, KrexError)
    return cls(message, traceback) if issubclass(cls, RemoteError) else cls(message)


#: the exit codes of every ``krex`` subcommand (docs/troubleshooting.md, "Exit codes of krex"):
#: FAILED, the work was tried and failed (no arbiter, a refused request, an incorrect candidate);
#: BAD_CALL, the call itself is wrong (its usage, a file it names that is not there, a value the
#: node cannot serve such as a GPU it does not have), nothing was done. argparse exits 2 too.
FAILED = 1
BAD_CALL = 2


def exit_code(exc: BaseException) -> int:
    """:data:`BAD_CALL` for an error the caller's arguments made, else :data:`FAILED`."""
    return BAD_CALL if isinstance(exc, (InvalidRequest, FileNotFoundError, ValueError, TypeError)) else FAILED


def fail_as_json(prog: str, exc: BaseException) -> int:
    """How a ``--json`` command fails: JSON on stdout (an ``error`` field) and nothing else, since
    whoever asked for JSON reads it, not a line on stderr that says the same; the exit code is
    :func:`exit_code`'s. (``prog`` names the command in the error for a log that mixes several.)"""
    import json

    print(json.dumps({"error": str(exc), "type": type(exc).__name__, "command": prog}, indent=2))
    return exit_code(exc)
