"""KREX Lab: region-granular GPU exclusivity for concurrent kernel benchmarking.

Public API (imports are cheap; vendor libraries load lazily)::

    import krex_lab
    krex_lab.attach(gpu=None)             # register this process as a session
    with krex_lab.exclusive() as region:  # the GPU alone, for the timing loop
        ...
    region.report
"""

from __future__ import annotations

from ._version import __version__
from .errors import (
    ArbiterUnavailable,
    BackendError,
    InvalidRequest,
    JobTimeout,
    KrexError,
    LeaseExpired,
    NotHolder,
    PermissionDenied,
    PoolUnavailable,
    ProtocolError,
    QuotaExceeded,
    RegionCancelled,
    RegionRevoked,
    RemoteError,
    RequestRejected,
    UnknownSession,
    WorkerDied,
)

__all__ = [
    "ArbiterUnavailable",
    "BackendError",
    "Evaluation",
    "InvalidRequest",
    "JobTimeout",
    "KrexError",
    "LeaseExpired",
    "Measurement",
    "NotHolder",
    "PermissionDenied",
    "PoolUnavailable",
    "ProtocolError",
    "QuotaExceeded",
    "RegionCancelled",
    "RegionReport",
    "RegionRevoked",
    "RegionSpec",
    "RemoteError",
    "RequestRejected",
    "UnknownSession",
    "WorkerDied",
    "__version__",
    "attach",
    "bench",
    "check",
    "dashboard",
    "evaluate",
    "evaluate_many",
    "exclusive",
    "submit",
]

# `typing` costs a command's start (re, functools...): the checker alone reads these names.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .bench import Measurement, bench, check
    from .client import attach, exclusive
    from .dashboard import dashboard
    from .evaluate import Evaluation
    from .evaluate.api import evaluate
    from .evaluate.many import evaluate_many
    from .protocol import RegionSpec
    from .region_report import RegionReport
    from .workers.client import submit


def __getattr__(name: str) -> Any:
    # Lazy: `import krex_lab` must not pay for zmq sockets or GPU libraries.
    if name in ("attach", "exclusive", "Session", "Region", "Client"):
        from . import client

        return getattr(client, name)
    if name == "dashboard":  # the (callable) package; ipywidgets loads only when a dashboard is made
        import importlib

        return importlib.import_module(".dashboard", __name__)
    if name in ("bench", "check", "Measurement"):  # bench is the (callable) package: krex_lab.bench(fn, *args)
        import importlib

        harness = importlib.import_module(".bench", __name__)
        return harness if name == "bench" else getattr(harness, name)
    if name == "RegionReport":  # what region.report is
        from .region_report import RegionReport

        return RegionReport
    if name == "RegionSpec":  # what a region is asked to be
        from .protocol import RegionSpec

        return RegionSpec
    if name in ("evaluate", "Evaluation"):  # evaluate is the (callable) package: krex_lab.evaluate(ref, cand)
        import importlib

        package = importlib.import_module(".evaluate", __name__)
        return package if name == "evaluate" else getattr(package, name)
    if name == "evaluate_many":  # many pairs over every GPU of the node
        from .evaluate.many import evaluate_many

        return evaluate_many
    if name == "submit":
        from .workers.client import submit

        return submit
    raise AttributeError(f"module 'krex_lab' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    from .magics import load_ipython_extension as load

    load(ipython)
