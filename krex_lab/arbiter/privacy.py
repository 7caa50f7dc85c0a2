"""What one user sees of another's work: by default, user names and counts, never pids or names.

A viewer is a uid the kernel vouched for (an identity ticket, :mod:`.identity`), or ``None`` for
an anonymous one. :func:`status_view` and :func:`report_view` keep the viewer's own sessions and
regions in full and reduce everyone else's to who and how much. Events go to every subscriber
alike, so a multi-user arbiter publishes them as the anonymous view (:func:`public_event`).
Admins (and ``Arbiter.privacy = "open"``, for trusted labs) see everything.
"""

from __future__ import annotations

import collections
from typing import Any, TypeVar

import msgspec

from ..node_status import HolderRow, NodeStatus, QueueRow, SessionRow
from ..region_report import PUBLIC, RegionReport

#: what anyone may know of another user's region: the report's public fields, and what a
#: status row (a holder, a waiter) or an event adds to them
_REGION_KEYS = frozenset((*PUBLIC, "held_s", "waiting_s", "time", "event"))

Row = TypeVar("Row", HolderRow, QueueRow)


def _mine(entry: RegionReport | HolderRow | QueueRow | SessionRow, viewer: int | None) -> bool:
    return viewer is not None and entry.uid == viewer


def _reduced(row: Row) -> Row:
    """Another user's holder or waiter: the fields anyone may see, the others None (left out)."""
    hidden = {f: None for f in row.__struct_fields__ if f not in _REGION_KEYS and f != "region"}
    return msgspec.structs.replace(row, **hidden)


def report_view(report: RegionReport, viewer: int | None) -> dict[str, Any]:
    """A report as ``viewer`` may see it (its JSON form): whole when it is theirs, else its
    public fields (:meth:`~krex_lab.region_report.RegionReport.public_dict`)."""
    return report.to_dict() if _mine(report, viewer) else report.public_dict()


def _row_view(row: Row, viewer: int | None) -> Row:
    return row if _mine(row, viewer) else _reduced(row)


def status_view(table: NodeStatus, viewer: int | None) -> NodeStatus:
    """The node table as ``viewer`` may see it: their own sessions, holders and waiters in full,
    others' as who and how much (``other_sessions``: how many sessions each other user has)."""
    gpus = []
    for g in table.gpus:
        own = [s for s in g.sessions if _mine(s, viewer)]
        others = collections.Counter(s.user for s in g.sessions if not _mine(s, viewer))
        gpus.append(
            msgspec.structs.replace(
                g,
                holder=None if g.holder is None else _row_view(g.holder, viewer),
                queue=[_row_view(q, viewer) for q in g.queue],
                sessions=own,
                other_sessions=dict(others),
            )
        )
    return msgspec.structs.replace(table, gpus=gpus)


def _keep(data: dict[str, Any], keys: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k in keys}


_SESSION_EVENT = frozenset(("event", "user", "gpu", "role", "time"))
_GATE_EVENT = frozenset(("gpu", "closed", "region", "time"))


def public_event(topic: str, data: dict[str, Any]) -> dict[str, Any]:
    """The anonymous view of an event (what every subscriber of a private arbiter gets). ``data``
    is the event's JSON body, whose shape is its topic's (the server publishes it as it is)."""
    if topic == "session":
        return _keep(data, _SESSION_EVENT)
    if topic == "region":
        return _keep(data, _REGION_KEYS)
    if topic == "gate":
        return _keep(data, _GATE_EVENT)
    if topic == "telemetry":
        view: dict[str, Any] = msgspec.to_builtins(status_view(NodeStatus.of(data), None))
        extra = {k: v for k, v in data.items() if k not in NodeStatus.__struct_fields__}
        # the server's own reports, or their JSON form
        regions = [r if isinstance(r, RegionReport) else RegionReport.from_dict(r) for r in data.get("regions", [])]
        return {**extra, **view, "processes": [], "regions": [r.public_dict() for r in regions]}
    return data
