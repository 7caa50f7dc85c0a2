"""The errors KREX raises, one small hierarchy.

    KrexError                       anything KREX reports
    ├── ArbiterUnavailable          no arbiter answers at the endpoint (says how to start one)
    ├── ProtocolError               a message broke the protocol (bad bytes, schema, version, size)
    ├── RequestRejected             the arbiter refused a well-formed request
    │   ├── PermissionDenied        the request touches another user's process or region
    │   ├── NotHolder               release of a region this session does not hold
    │   ├── UnknownSession          the session id/token is not (or no longer) registered
    │   └── InvalidRequest          a value is out of range (a GPU that does not exist, ...)
    ├── LeaseExpired                the region was force-released at its max_hold
    ├── RegionCancelled             the request was withdrawn or the arbiter shut down before grant
    └── BackendError                the GPU backend failed (driver, NVML, amdsmi)

Every error the arbiter sends has a ``type`` that names one of these classes, so a client
re-raises the same class the arbiter meant (:func:`error_from_wire`).
"""

from __future__ import annotations


class KrexError(Exception):
    """Base of every KREX error."""


class ArbiterUnavailable(KrexError):
    """No arbiter answered at the endpoint."""


class ProtocolError(KrexError):
    """A message that breaks the protocol."""


class RequestRejected(KrexError):
    """A well-formed request the arbiter refused."""


class PermissionDenied(RequestRejected):
    """The request concerns a process or region of another user."""


class NotHolder(RequestRejected):
    """Release or renewal of a region that the session does not hold."""


class UnknownSession(RequestRejected):
    """The session is not registered (it ended, or the token is wrong)."""


class InvalidRequest(RequestRejected):
    """A request whose values are out of range."""


class LeaseExpired(KrexError):
    """The region outlived its ``max_hold`` and was released by the arbiter."""


class RegionCancelled(KrexError):
    """The region was never granted: cancelled, or the arbiter went away."""


class BackendError(KrexError):
    """The GPU backend failed."""


_BY_NAME: dict[str, type[KrexError]] = {
    cls.__name__: cls
    for cls in (
        KrexError,
        ArbiterUnavailable,
        ProtocolError,
        RequestRejected,
        PermissionDenied,
        NotHolder,
        UnknownSession,
        InvalidRequest,
        LeaseExpired,
        RegionCancelled,
        BackendError,
    )
}


def error_from_wire(type_name: str, message: str) -> KrexError:
    """The exception an error reply stands for (unknown names fall back to :class:`KrexError`)."""
    return _BY_NAME.get(type_name, KrexError)(message)
