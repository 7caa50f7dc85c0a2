"""What one user sees of another's work: by default, user names and counts, never pids or names.

A viewer is a uid the kernel vouched for (an identity ticket, :mod:`.identity`), or ``None`` for
an anonymous one. :func:`status_view` and :func:`report_view` keep the viewer's own sessions and
regions in full and reduce everyone else's to who and how much. Events go to every subscriber
alike, so a multi-user arbiter publishes them as the anonymous view (:func:`public_event`).
Admins (and ``Arbiter.privacy = "open"``, for trusted labs) see everything.
"""

from __future__ import annotations

import collections
from typing import Any

from ..region_report import PUBLIC, RegionReport

#: what anyone may know of another user's region: the report's public fields, and what a
#: status row (a holder, a waiter), a history row or an event adds to them
_REGION_KEYS = (*PUBLIC, "held_s", "waiting_s", "time", "event")


def _mine(entry: dict[str, Any] | RegionReport, viewer: int | None) -> bool:
    if isinstance(entry, RegionReport):
        return viewer is not None and entry.uid == viewer
    return viewer is not None and entry.get("uid") == viewer  # a status row: its session's uid


def _reduced(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: entry[k] for k in _REGION_KEYS if k in entry}


def report_view(report: dict[str, Any] | RegionReport, viewer: int | None) -> dict[str, Any]:
    """A report (or a row that shows a region) as ``viewer`` may see it: whole when it is theirs."""
    if isinstance(report, RegionReport):
        return report.to_dict() if _mine(report, viewer) else report.public_dict()
    return report if _mine(report, viewer) else _reduced(report)


def status_view(table: dict[str, Any], viewer: int | None) -> dict[str, Any]:
    gpus = []
    for g in table["gpus"]:
        holder = g["holder"]
        own = [s for s in g["sessions"] if _mine(s, viewer)]
        others = collections.Counter(s["user"] for s in g["sessions"] if not _mine(s, viewer))
        gpus.append(
            {
                **g,
                "holder": holder if holder is None else report_view(holder, viewer),
                "queue": [report_view(q, viewer) for q in g["queue"]],
                "sessions": own,
                "other_sessions": dict(others),
            }
        )
    return {**table, "gpus": gpus}


def public_event(topic: str, data: dict[str, Any]) -> dict[str, Any]:
    """The anonymous view of an event (what every subscriber of a private arbiter gets)."""
    if topic == "session":
        return {k: data[k] for k in ("event", "user", "gpu", "role", "time") if k in data}
    if topic == "region":
        return _reduced(data)
    if topic == "gate":
        return {k: data[k] for k in ("gpu", "closed", "region", "time") if k in data}
    if topic == "telemetry":
        view = status_view(data, None)
        view["processes"] = []
        view["regions"] = [_reduced(r) for r in data.get("regions", [])]
        return view
    return data
