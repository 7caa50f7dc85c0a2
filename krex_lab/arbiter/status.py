"""The node's table, as ``krex status --json``, ``%krex_status`` and the REST API give it."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .server import Arbiter


def node_status(arb: Arbiter) -> dict[str, Any]:
    now = time.monotonic()
    gpus = []
    for info in arb.backend.inventory():
        g = info.index
        active = arb.scheduler.active.get(g)
        holder = None
        if active is not None:
            holder = {
                "region": active.id,
                "state": active.state,
                "session": active.session.id,
                "pid": active.session.pid,
                "user": active.session.user,
                "name": active.session.name,
                "role": active.session.role,
                "held_s": round(now - active.granted_at, 3) if active.granted_at else 0.0,
                "max_hold_s": active.max_hold,
            }
        gpus.append({
            **info.to_dict(),
            "gate": "closed" if not arb.gate.is_open(g) else "open",
            "holder": holder,
            "queue": [
                {"region": r.id, "session": r.session.id, "pid": r.session.pid, "name": r.session.name,
                 "user": r.session.user, "waiting_s": round(now - r.requested, 3)}
                for r in arb.scheduler.queues[g]
            ],
            "sessions": [s.public() for s in arb.sessions.on_gpu(g)],
        })
    return {
        "arbiter": {
            "pid": os.getpid(),
            "endpoint": arb.bound,
            "events": arb.events,
            "started": arb.started,
            "sessions": len(arb.sessions),
            **arb.backend_info,
        },
        "gpus": gpus,
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
    for g in status["gpus"]:
        mem = f"{g['memory_used'] / 2**30:.1f}/{g['memory_total'] / 2**30:.0f} GiB" if g["memory_total"] else "-"
        util = f"{g['utilization_gpu']:.0f}%" if g.get("utilization_gpu") is not None else "-"
        lines.append(f"GPU {g['index']}: {g['name']}  mem {mem}  util {util}  gate {g['gate']}")
        h = g["holder"]
        if h:
            lines.append(f"  holder: {h['name']} (pid {h['pid']}, {h['user']}) region {h['region']} "
                         f"{h['state']} {h['held_s']:.1f}/{h['max_hold_s']:.0f} s")
        else:
            lines.append("  holder: -")
        for i, q in enumerate(g["queue"], 1):
            lines.append(f"  waiting {i}: {q['name']} (pid {q['pid']}, {q['user']}) {q['waiting_s']:.1f} s")
        for s in g["sessions"]:
            lines.append(f"  session {s['id']}: {s['role']:<6} {s['name']} pid {s['pid']} user {s['user']}")
    return "\n".join(lines)
