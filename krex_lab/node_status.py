"""The node's table, as ``krex status --json``, ``%krex_status``, the REST API and the telemetry
events give it: :class:`NodeStatus`, its rows, and their plain-text rendering.

These are wire types, beside :mod:`krex_lab.protocol`: the arbiter encodes them
(:func:`krex_lab.arbiter.status.node_table`), and every reader of the table (the client, the
magics, the dashboard, the server extension, the pool, Ray, Slurm's prolog) decodes and shows
them without importing the arbiter."""

from __future__ import annotations

import msgspec

from .protocol import Capabilities
from .region_report import RegionReport


class SlurmJob(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The Slurm job a session runs in, as its status rows and region reports carry it (flat, beside
    the row's own fields: an encoded row of a session in no job has none of them)."""

    slurm_job: str | None = None
    slurm_step: str | None = None
    account: str | None = None


class SessionRow(SlurmJob, kw_only=True, omit_defaults=True):
    """A session as ``krex status`` lists it, and as a session event carries it (beside
    ``event``). A field that is None was not given (a hand-made or an older table)."""

    id: str
    pid: int
    uid: int
    user: str
    role: str
    name: str
    gpu: int
    within: str | None = None
    cgroup: str | None = None
    since: float | None = None


class HolderRow(SlurmJob, kw_only=True, omit_defaults=True):
    """The region that holds a GPU. Another user's, on a private arbiter, keeps only what
    :mod:`krex_lab.arbiter.privacy` lets anyone see: a field that is None is left out of the encoded row."""

    region: str
    state: str | None = None
    session: str | None = None
    pid: int | None = None
    uid: int | None = None
    user: str | None = None
    name: str | None = None
    role: str | None = None
    #: seconds since the grant
    held_s: float | None = None
    #: the region's lease
    max_hold_s: float | None = None


class QueueRow(SlurmJob, kw_only=True, omit_defaults=True):
    """A region waiting for a GPU (reduced for another user as :class:`HolderRow` is)."""

    region: str
    session: str | None = None
    pid: int | None = None
    name: str | None = None
    uid: int | None = None
    user: str | None = None
    #: seconds since the request
    waiting_s: float | None = None


class GpuRow(msgspec.Struct, kw_only=True):
    """One GPU of the table: the backend's :class:`~krex_lab.gpu.base.GpuInfo`, its gate, holder,
    queue in order and the sessions placed on it."""

    index: int
    name: str = ""
    uuid: str = ""
    memory_total: int = 0
    memory_used: int = 0
    utilization_gpu: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    throttle_reasons: list[str] = []
    simulated: bool = False
    gate: str = "open"
    holder: HolderRow | None = None
    queue: list[QueueRow] = []
    #: the viewer's sessions (every session, for an admin or on an open arbiter)
    sessions: list[SessionRow] = []
    #: user -> how many sessions of theirs a private view left out (unset, and not encoded, in a
    #: full view: a reader tells the views apart by its presence)
    other_sessions: dict[str, int] | msgspec.UnsetType = msgspec.UNSET


class ArbiterRow(msgspec.Struct, kw_only=True):
    """The arbiter itself: its process, endpoints, backend and settings that ``krex status`` shows."""

    pid: int = 0
    endpoint: str = ""
    events: str = ""
    #: when it started (epoch seconds)
    started: float = 0.0
    #: how cores are shielded
    shield: str = ""
    #: whether regions are held against their neighbours (``Arbiter.guard_neighbours``)
    guard_neighbours: bool = False
    shield_linger_s: float = 0.0
    #: how sessions are frozen: through the cgroups they were placed in, or why not (SIGSTOP)
    cgroups: str = ""
    #: the last SIGHUP's quota reload (empty: the quotas it started with)
    quotas: str = ""
    backend: str = ""
    simulated: bool = False
    capabilities: Capabilities = msgspec.field(default_factory=Capabilities)
    #: the GPU driver's version, where the backend knows it
    driver: str = ""
    sessions: int = 0


class ShareRow(msgspec.Struct, kw_only=True):
    """One user's fair-share charge, as ``krex status`` lists it."""

    uid: int
    user: str
    #: hold plus each region's cost to the others, decayed (seconds)
    charged_s: float
    regions: int


class NodeStatus(msgspec.Struct, kw_only=True):
    """The node's table (``krex status``): the arbiter, every GPU, and each user's fair-share charge."""

    arbiter: ArbiterRow = msgspec.field(default_factory=ArbiterRow)
    gpus: list[GpuRow] = []
    #: what fair share charges each user (hold plus each region's cost to the others), most first
    fair_share: list[ShareRow] = []

    @classmethod
    def of(cls, table: object) -> NodeStatus:
        """The table itself, or decoded from its JSON form (what the arbiter's Status request
        answers); a malformed one raises ``msgspec.ValidationError``."""
        return table if isinstance(table, NodeStatus) else msgspec.convert(table, cls, strict=False)


class GpuProcessRow(msgspec.Struct, kw_only=True):
    """A process on a GPU and its memory, as a telemetry event lists it (NVML's; none on the fake backend)."""

    gpu: int
    pid: int
    used_memory: int | None = None


class Telemetry(NodeStatus, kw_only=True):
    """A ``krex.telemetry`` event: the node table (as a subscriber may see it), the event's
    number and period, the GPU processes' memory and the last finished regions."""

    seq: int = 0
    #: seconds between telemetry events
    interval: float = 0.0
    #: None where the event carries none (a snapshot of the table alone)
    processes: list[GpuProcessRow] | None = None
    regions: list[RegionReport] = []


def format_table(status: object) -> str:
    """A plain-text table for terminals, agents and ``%krex_status`` (``status``: a
    :class:`NodeStatus` or its JSON form)."""
    table = NodeStatus.of(status)
    a = table.arbiter
    caps = a.capabilities
    lines = [
        f"krex arbiter pid {a.pid} at {a.endpoint} - backend {a.backend}"
        + ("  [SIMULATED GPUs: fake backend, no real GPU]" if a.simulated else ""),
        f"  drain by driver lock: {'yes' if caps.lock else 'no'}" + (f" ({caps.reason})" if caps.reason else ""),
    ]
    if a.quotas:
        lines.append(f"  quotas: {a.quotas}")
    if a.cgroups:
        placed = a.cgroups.startswith("sessions placed")
        freezer = f"cgroup v2 (cgroup.freeze; {a.cgroups})" if placed else f"SIGSTOP (cgroups: {a.cgroups})"
        lines.append(f"  freezer: {freezer}")
    if table.fair_share:
        lines.append(
            "  fair share (hold + each region's cost, decaying; while others wait the last holder goes after them): "
            + ", ".join(f"{s.user} {s.charged_s:.2f} s/{s.regions} regions" for s in table.fair_share)
        )
    for g in table.gpus:
        mem = f"{g.memory_used / 2**30:.1f}/{g.memory_total / 2**30:.0f} GiB" if g.memory_total else "-"
        util = f"{g.utilization_gpu:.0f}%" if g.utilization_gpu is not None else "-"
        lines.append(f"GPU {g.index}: {g.name}  mem {mem}  util {util}  gate {g.gate}")
        lines.extend("  " + row for row in gpu_rows(g))
    return "\n".join(lines)


def who(entry: HolderRow | QueueRow) -> str:
    """A holder's or waiter's owner as far as the viewer may see it: ``name (pid N, user)`` for
    their own (or anyone's, for an admin or an open arbiter), ``user U`` for another user's, whose
    name and pid the privacy view leaves out."""
    if entry.name is not None and entry.pid is not None:
        return f"{entry.name} (pid {entry.pid}, {entry.user or '?'})"
    return f"user {entry.user or '?'}"


def holder_row(h: HolderRow | None) -> str:
    if not h:
        return "holder: -"
    return (
        f"holder: {who(h)} region {h.region} {h.state or ''} {h.held_s or 0.0:.1f}/{h.max_hold_s or 0.0:.0f} s{_job(h)}"
    )


def queue_row(i: int, q: QueueRow) -> str:
    return f"waiting {i}: {who(q)} {q.waiting_s or 0.0:.1f} s{_job(q)}"


def _job(entry: SlurmJob) -> str:
    """`` slurm job 12.batch (account)`` for a session in a Slurm job (Arbiter.slurm), else ''."""
    if not entry.slurm_job:
        return ""
    account = f" ({entry.account})" if entry.account else ""
    return f" slurm job {entry.slurm_job}.{entry.slurm_step or '?'}{account}"


def gpu_rows(g: GpuRow) -> list[str]:
    """The rows of one GPU of a status table, for any viewer at any privacy level: the holder, the
    queue in order, the viewer's sessions (every session, for an admin) and the other users' as
    names and counts (``other_sessions``, what a private arbiter shows of them)."""
    rows = [holder_row(g.holder)]
    rows.extend(queue_row(i, q) for i, q in enumerate(g.queue, 1))
    for s in g.sessions:
        rows.append(f"session {s.id}: {s.role:<6} {s.name} pid {s.pid} user {s.user}{_job(s)}")
    if g.other_sessions:
        counts = ", ".join(f"{u} ({n})" for u, n in sorted(g.other_sessions.items()))
        rows.append(f"other users' sessions: {counts}")
    return rows
