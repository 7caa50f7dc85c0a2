"""The node's table, as ``krex status --json``, ``%krex_status`` and the REST API give it."""

from __future__ import annotations

import time
from typing import Any

from ..gpu.base import GpuInfo
from ..regions.gate import Gate
from .scheduler import Scheduler
from .sessions import SessionTable


def node_status(
    inventory: list[GpuInfo], scheduler: Scheduler, gate: Gate, sessions: SessionTable, arbiter: dict[str, Any]
) -> dict[str, Any]:
    """The table of every GPU (``inventory``) with its gate, holder, queue and sessions;
    ``arbiter`` describes the arbiter itself (pid, endpoints, backend)."""
    now = time.monotonic()
    gpus = []
    for info in inventory:
        g = info.index
        active = scheduler.active.get(g)
        holder = None
        if active is not None:
            holder = {
                "region": active.id,
                "state": active.state.value,
                "session": active.session.id,
                "pid": active.session.pid,
                "uid": active.session.uid,
                "user": active.session.user,
                "name": active.session.name,
                "role": active.session.role,
                "held_s": round(now - active.granted_at, 3) if active.granted_at else 0.0,
                "max_hold_s": active.max_hold,
                **active.session.job,
            }
        gpus.append(
            {
                **info.to_dict(),
                "gate": "closed" if not gate.is_open(g) else "open",
                "holder": holder,
                "queue": [
                    {
                        "region": r.id,
                        "session": r.session.id,
                        "pid": r.session.pid,
                        "name": r.session.name,
                        "uid": r.session.uid,
                        "user": r.session.user,
                        "waiting_s": round(now - r.requested, 3),
                        **r.session.job,
                    }
                    for r in scheduler.queues[g]
                ],
                "sessions": [s.public() for s in sessions.on_gpu(g)],
            }
        )
    table = getattr(scheduler.policy, "table", None)
    return {
        "arbiter": {**arbiter, "sessions": len(sessions)},
        "gpus": gpus,
        #: what fair share charges each user (hold plus each region's cost to the others), most first
        "fair_share": table() if table is not None else [],
    }


def format_table(status: dict[str, Any]) -> str:
    """A plain-text table for terminals, agents and ``%krex_status``."""
    a = status["arbiter"]
    lines = [
        f"krex arbiter pid {a['pid']} at {a['endpoint']} - backend {a['backend']}"
        + ("  [SIMULATED GPUs: fake backend, no real GPU]" if a["simulated"] else ""),
        f"  drain by driver lock: {'yes' if a['capabilities']['lock'] else 'no'}"
        + (f" ({a['capabilities']['reason']})" if a["capabilities"].get("reason") else ""),
    ]
    if a.get("quotas"):
        lines.append(f"  quotas: {a['quotas']}")
    if a.get("cgroups"):
        cgroup = str(a["cgroups"])
        placed = cgroup.startswith("sessions placed")
        freezer = f"cgroup v2 (cgroup.freeze; {cgroup})" if placed else f"SIGSTOP (cgroups: {cgroup})"
        lines.append(f"  freezer: {freezer}")
    shares = status.get("fair_share") or []
    if shares:
        lines.append(
            "  fair share (hold + each region's cost, decaying; while others wait the last holder goes after them): "
            + ", ".join(f"{s['user']} {s['charged_s']:.2f} s/{s['regions']} regions" for s in shares)
        )
    for g in status["gpus"]:
        mem = f"{g['memory_used'] / 2**30:.1f}/{g['memory_total'] / 2**30:.0f} GiB" if g["memory_total"] else "-"
        util = f"{g['utilization_gpu']:.0f}%" if g.get("utilization_gpu") is not None else "-"
        lines.append(f"GPU {g['index']}: {g['name']}  mem {mem}  util {util}  gate {g['gate']}")
        lines.extend("  " + row for row in gpu_rows(g))
    return "\n".join(lines)


def who(entry: dict[str, Any]) -> str:
    """A holder's or waiter's owner as far as the viewer may see it: ``name (pid N, user)`` for
    their own (or anyone's, for an admin or an open arbiter), ``user U`` for another user's, whose
    name and pid the privacy view leaves out."""
    if "name" in entry and "pid" in entry:
        return f"{entry['name']} (pid {entry['pid']}, {entry.get('user', '?')})"
    return f"user {entry.get('user', '?')}"


def holder_row(h: dict[str, Any] | None) -> str:
    if not h:
        return "holder: -"
    return (
        f"holder: {who(h)} region {h['region']} {h.get('state', '')} "
        f"{h.get('held_s') or 0.0:.1f}/{h.get('max_hold_s') or 0.0:.0f} s{_job(h)}"
    )


def queue_row(i: int, q: dict[str, Any]) -> str:
    return f"waiting {i}: {who(q)} {q.get('waiting_s') or 0.0:.1f} s{_job(q)}"


def _job(entry: dict[str, Any]) -> str:
    """`` slurm job 12.batch (account)`` for a session in a Slurm job (Arbiter.slurm), else ''."""
    if not entry.get("slurm_job"):
        return ""
    account = f" ({entry['account']})" if entry.get("account") else ""
    return f" slurm job {entry['slurm_job']}.{entry.get('slurm_step', '?')}{account}"


def gpu_rows(g: dict[str, Any]) -> list[str]:
    """The rows of one GPU of a status table, for any viewer at any privacy level: the holder, the
    queue in order, the viewer's sessions (every session, for an admin) and the other users' as
    names and counts (``other_sessions``, what a private arbiter shows of them)."""
    rows = [holder_row(g.get("holder"))]
    rows.extend(queue_row(i, q) for i, q in enumerate(g.get("queue", []), 1))
    for s in g.get("sessions", []):
        rows.append(f"session {s['id']}: {s['role']:<6} {s['name']} pid {s['pid']} user {s['user']}{_job(s)}")
    others = g.get("other_sessions") or {}
    if others:
        counts = ", ".join(f"{u} ({n})" for u, n in sorted(others.items()))
        rows.append(f"other users' sessions: {counts}")
    return rows
