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
    return {
        "arbiter": {**arbiter, "sessions": len(sessions)},
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
            lines.append(
                f"  holder: {h['name']} (pid {h['pid']}, {h['user']}) region {h['region']} "
                f"{h['state']} {h['held_s']:.1f}/{h['max_hold_s']:.0f} s{_job(h)}"
            )
        else:
            lines.append("  holder: -")
        for i, q in enumerate(g["queue"], 1):
            lines.append(f"  waiting {i}: {q['name']} (pid {q['pid']}, {q['user']}) {q['waiting_s']:.1f} s{_job(q)}")
        for s in g["sessions"]:
            lines.append(f"  session {s['id']}: {s['role']:<6} {s['name']} pid {s['pid']} user {s['user']}{_job(s)}")
    return "\n".join(lines)


def _job(entry: dict[str, Any]) -> str:
    """`` slurm job 12.batch (account)`` for a session in a Slurm job (Arbiter.slurm), else ''."""
    if not entry.get("slurm_job"):
        return ""
    account = f" ({entry['account']})" if entry.get("account") else ""
    return f" slurm job {entry['slurm_job']}.{entry.get('slurm_step', '?')}{account}"
