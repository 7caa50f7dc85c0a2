"""The node's table as the arbiter builds it (:func:`node_table`) from its scheduler, gate and
sessions, and what the arbiter says of itself (its row, its answer to Hello); the table's types
and rendering are wire types, in :mod:`krex_lab.node_status`."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import msgspec

from .. import protocol
from .._version import __version__
from ..node_status import ArbiterRow, GpuRow, HolderRow, NodeStatus, QueueRow

if TYPE_CHECKING:
    from ..enforcement.gate import Gate
    from ..gpu.base import BackendDescription, GpuInfo
    from .scheduler import Scheduler
    from .sessions import SessionTable


def arbiter_row(backend_info: BackendDescription, **fields: Any) -> ArbiterRow:
    """The arbiter's own row: what the backend's describe() says (backend, simulated, capabilities
    and driver), with ``fields``."""
    described = msgspec.convert(msgspec.to_builtins(backend_info), ArbiterRow, strict=False)
    return msgspec.structs.replace(described, **fields)


def hello_info(gpus: int, identity: str, events: str, backend_info: BackendDescription) -> protocol.Info:
    """The arbiter's answer to Hello."""
    return protocol.Info(
        version=__version__,
        protocol=protocol.VERSION,
        pid=os.getpid(),
        gpus=gpus,
        identity=identity,
        events=events,
        **backend_info,
    )


def node_table(
    inventory: list[GpuInfo], scheduler: Scheduler, gate: Gate, sessions: SessionTable, arbiter: ArbiterRow
) -> NodeStatus:
    """The table of every GPU (``inventory``) with its gate, holder, queue and sessions;
    ``arbiter`` describes the arbiter itself (pid, endpoints, backend)."""
    now = time.monotonic()
    gpus = []
    for info in inventory:
        g = info.index
        active = scheduler.active.get(g)
        holder = None
        if active is not None:
            s = active.session
            holder = HolderRow(
                region=active.id,
                state=active.state.value,
                session=s.id,
                pid=s.pid,
                uid=s.uid,
                user=s.user,
                name=s.name,
                role=s.role,
                held_s=round(now - active.granted_at, 3) if active.granted_at else 0.0,
                max_hold_s=active.max_hold,
                **msgspec.structs.asdict(s.job),
            )
        queue = [
            QueueRow(
                region=r.id,
                session=r.session.id,
                pid=r.session.pid,
                name=r.session.name,
                uid=r.session.uid,
                user=r.session.user,
                waiting_s=round(now - r.requested, 3),
                **msgspec.structs.asdict(r.session.job),
            )
            for r in scheduler.queues[g]
        ]
        gpus.append(
            msgspec.structs.replace(
                msgspec.convert(info, GpuRow, from_attributes=True),
                gate="closed" if not gate.is_open(g) else "open",
                holder=holder,
                queue=queue,
                sessions=[s.public() for s in sessions.on_gpu(g)],
            )
        )
    table = getattr(scheduler.policy, "table", None)
    return NodeStatus(
        arbiter=msgspec.structs.replace(arbiter, sessions=len(sessions)),
        gpus=gpus,
        fair_share=table() if table is not None else [],
    )
