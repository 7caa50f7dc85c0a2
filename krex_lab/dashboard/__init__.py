"""``krex_lab.dashboard()``: a live ipywidgets view of who holds, waits for and uses each GPU.

    import krex_lab
    krex_lab.dashboard()            # every GPU of the node; refreshed at most once a second

It listens to the arbiter's event stream (one SUB socket per dashboard; the arbiter publishes
the node's readings once per period for all subscribers), never queries the GPUs itself, keeps
updating while other cells run, and says so when the arbiter goes away (and reconnects when it
returns). ``%krex_status`` and ``krex status --json`` remain the text and machine forms.

Modules: :mod:`.model` (the state and a pure reducer of events, no widgets), :mod:`.feed` (the
SUB socket thread), :mod:`.view` (the widgets and the HTML/SVG they show).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .view import Dashboard

__all__ = ["dashboard"]


def dashboard(gpus: Iterable[int] | int | None = None, refresh: float = 1.0, endpoint: str | None = None) -> Dashboard:
    """A widget with one panel per GPU (``gpus``: all by default), redrawn at most every ``refresh`` seconds.

    Each panel shows the GPU's name and backend (simulated ones said so), utilisation and memory
    bars, SM clock, the region holder (user, session, role, elapsed time against ``max_hold``),
    the waiting queue in order, the sessions on the GPU (user, name, role, pid, GPU memory where
    the backend knows it) and a timeline of recent regions (wait and hold times, drained and
    frozen counts, degraded ones marked). ``endpoint``: the arbiter's (default ``$KREX_ENDPOINT``,
    else this user's). ``close()`` stops it. It returns once the first snapshot arrived (or the arbiter
    was found missing), at most 2 s, so that the cell's output shows the node rather than "connecting".
    """
    if refresh <= 0:
        raise ValueError("refresh must be a positive number of seconds")
    try:
        from .view import Dashboard
    except ImportError as exc:
        from ..errors import MissingDependency

        install = "pip install 'krex-lab[jupyter]'"
        raise MissingDependency.of("ipywidgets", "krex_lab.dashboard()", install, exc) from exc

    return Dashboard(gpus=gpus, refresh=refresh, endpoint=endpoint)


class _CallableModule(types.ModuleType):
    """``krex_lab.dashboard`` is this package once anything imported it (Python sets the attribute), so the
    package itself is callable: ``krex_lab.dashboard(...)`` is :func:`dashboard` either way."""

    def __call__(self, *args: Any, **kwargs: Any) -> Dashboard:
        return dashboard(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
