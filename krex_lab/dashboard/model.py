"""The dashboard's state: a pure reducer of the arbiter's events, with no widgets and no sockets.

    state = NodeState()
    state = reduce(state, Event("snapshot", {"hello": ..., "status": ..., "regions": [...]}, time.time()))
    state = reduce(state, Event("region", {"event": "granted", ...}, time.time()))

Events are what the arbiter publishes (``krex.session``, ``krex.gate``, ``krex.region``,
``krex.telemetry``; the topic without ``krex.``) plus two made by the feed: ``snapshot`` (the
``status`` and ``regions`` replies read on (re)connect) and ``lost`` (the arbiter stopped
answering). :func:`reduce` never mutates its input: it returns a new :class:`NodeState` that
shares what did not change. Every event is idempotent where it can be (a snapshot may already
contain what a queued event says), and a telemetry event replaces the whole picture, so a
missed event is healed within one telemetry period.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from ..node_status import GpuProcessRow, NodeStatus, Telemetry
from ..region_report import RegionReport

#: regions kept per GPU for the timeline
MAX_REGIONS = 24


@dataclass(frozen=True)
class Event:
    """One input of the reducer: ``topic`` (session, gate, region, telemetry, snapshot, lost), its data, and
    the wall time it happened (the arbiter's ``time`` field where it has one)."""

    topic: str
    data: Mapping[str, Any]
    at: float


@dataclass(frozen=True)
class SessionInfo:
    id: str
    pid: int
    user: str
    role: str
    name: str
    gpu: int
    within: str = ""
    since: float = 0.0
    memory: int | None = None  # bytes on the GPU, where the backend lists the process


@dataclass(frozen=True)
class Holder:
    region: str
    session: str
    pid: int
    user: str
    name: str
    role: str
    since: float  # wall time of the grant
    max_hold_s: float
    state: str = "held"
    degraded: bool = False
    intruders: int = 0
    frozen: tuple[int, ...] = ()  # pids the grant stopped (from the granted event)


@dataclass(frozen=True)
class Waiter:
    region: str
    session: str
    pid: int
    user: str
    name: str
    since: float  # wall time of the request


@dataclass(frozen=True)
class RegionRecord:
    """A finished region, as its final report tells it."""

    region: str
    session: str
    user: str
    name: str
    wait_s: float
    hold_s: float | None  # None: withdrawn before its grant
    acquire_s: float
    drained: int
    frozen: int
    degraded: bool
    expired: bool
    released_by: str
    not_drained: int = 0


@dataclass(frozen=True)
class GpuState:
    index: int
    name: str
    uuid: str = ""
    simulated: bool = False
    utilization: float | None = None
    memory_used: int = 0
    memory_total: int = 0
    sm_clock_mhz: int | None = None
    gate_closed: bool = False
    holder: Holder | None = None
    queue: tuple[Waiter, ...] = ()
    sessions: tuple[SessionInfo, ...] = ()
    regions: tuple[RegionRecord, ...] = ()
    #: other users' sessions, by user name, where a private shared arbiter shows only counts
    others: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class NodeState:
    connected: bool = False
    message: str = "connecting to the arbiter"
    arbiter_pid: int | None = None
    endpoint: str = ""
    backend: str = ""
    simulated: bool = False
    lock_capable: bool = False
    gpus: tuple[GpuState, ...] = ()
    telemetry_seq: int = 0
    telemetry_interval: float = 0.0
    last_message: float = 0.0  # wall time of the last thing heard from the arbiter
    lost_since: float | None = None
    events: int = 0  # events applied (all topics)

    def gpu(self, index: int) -> GpuState | None:
        return next((g for g in self.gpus if g.index == index), None)

    def session(self, session_id: str) -> SessionInfo | None:
        return next((s for g in self.gpus for s in g.sessions if s.id == session_id), None)


# -- the reducer ----------------------------------------------------------------------------
def reduce(state: NodeState, event: Event) -> NodeState:
    """The state after ``event`` (``state`` is left as it was)."""
    handler = _HANDLERS.get(event.topic)
    if handler is None:
        return state
    new = handler(state, event.data, event.at)
    return dataclasses.replace(new, events=state.events + 1)


def reduce_all(state: NodeState, events: Iterable[Event]) -> NodeState:
    for event in events:
        state = reduce(state, event)
    return state


def _heard(state: NodeState, at: float) -> NodeState:
    return dataclasses.replace(state, last_message=max(state.last_message, at))


class Snapshot(msgspec.Struct):
    """What the feed takes when it connects: the node table and the last finished regions."""

    status: NodeStatus = msgspec.field(default_factory=NodeStatus)
    regions: list[RegionReport] = []


def _snapshot(state: NodeState, data: Mapping[str, Any], at: float) -> NodeState:
    snap = msgspec.convert(data, Snapshot, strict=False)
    return _from_status(state, snap.status, snap.regions, None, at)


def _telemetry(state: NodeState, data: Mapping[str, Any], at: float) -> NodeState:
    t = msgspec.convert(data, Telemetry, strict=False)
    new = _from_status(state, t, t.regions, t.processes, at)
    return dataclasses.replace(new, telemetry_seq=t.seq, telemetry_interval=t.interval)


def _from_status(
    state: NodeState,
    status: NodeStatus,
    regions: Iterable[RegionReport],
    processes: Iterable[GpuProcessRow] | None,
    at: float,
) -> NodeState:
    """The whole picture from a status table (a snapshot or a telemetry event taken at ``at``)."""
    arb = status.arbiter
    pid = arb.pid or None  # a table without its arbiter's (a partial one)
    restarted = state.arbiter_pid is not None and pid is not None and pid != state.arbiter_pid
    memory: dict[int, int] = {}
    for p in processes or ():
        if p.used_memory is not None:
            memory[p.pid] = memory.get(p.pid, 0) + p.used_memory
    finished: dict[int, list[RegionRecord]] = {}
    for report in regions:
        finished.setdefault(report.gpu, []).append(_record(report))
    gpus = []
    for g in status.gpus:
        index = g.index
        old = None if restarted else state.gpu(index)
        sessions = tuple(
            SessionInfo(
                id=s.id,
                pid=s.pid,
                user=s.user,
                role=s.role,
                name=s.name,
                gpu=index,
                within=s.within or "",
                since=s.since or 0.0,
                memory=memory.get(s.pid) if processes is not None else _old_memory(old, s.id),
            )
            for s in g.sessions
        )
        h = g.holder
        holder = None
        if h:
            prior = old.holder if old is not None and old.holder and old.holder.region == h.region else None
            holder = Holder(
                region=h.region,
                session=h.session or "",  # None: another user's, on a private arbiter
                pid=h.pid or 0,
                user=h.user or "",
                name=h.name or "",
                role=h.role or "",
                since=prior.since if prior else at - (h.held_s or 0.0),
                max_hold_s=h.max_hold_s or 0.0,
                state=h.state or "held",
                degraded=prior.degraded if prior else False,
                intruders=prior.intruders if prior else 0,
                frozen=prior.frozen if prior else (),
            )
        queue = tuple(
            Waiter(
                region=q.region,
                session=q.session or "",
                pid=q.pid or 0,
                user=q.user or "",
                name=q.name or "",
                since=at - (q.waiting_s or 0.0),
            )
            for q in g.queue
        )
        gpus.append(
            GpuState(
                index=index,
                name=g.name or f"GPU {index}",
                uuid=g.uuid,
                simulated=g.simulated or arb.simulated,
                utilization=g.utilization_gpu,
                memory_used=g.memory_used,
                memory_total=g.memory_total,
                sm_clock_mhz=g.sm_clock_mhz,
                gate_closed=g.gate == "closed",
                holder=holder,
                queue=queue,
                sessions=sessions,
                regions=_merge(old.regions if old is not None else (), finished.get(index, [])),
                others=tuple(sorted((g.other_sessions or {}).items())),
            )
        )
    return dataclasses.replace(
        state,
        connected=True,
        message="live",
        arbiter_pid=pid,
        endpoint=arb.endpoint or state.endpoint,
        backend=arb.backend,
        simulated=arb.simulated,
        lock_capable=arb.capabilities.lock,
        gpus=tuple(gpus),
        lost_since=None,
        last_message=max(state.last_message, at),
        telemetry_seq=0 if restarted else state.telemetry_seq,
    )


def _old_memory(old: GpuState | None, session_id: str) -> int | None:
    if old is None:
        return None
    return next((s.memory for s in old.sessions if s.id == session_id), None)


def _record(r: RegionReport) -> RegionRecord:
    return RegionRecord(
        region=r.region or "?",
        session=r.session,
        user=r.user,
        name=r.name,
        wait_s=r.wait_s or 0.0,
        hold_s=r.hold_s,
        acquire_s=r.acquire_s or 0.0,
        drained=len(r.drained),
        frozen=len(r.frozen),
        degraded=r.degraded,
        expired=r.expired,
        released_by=r.released_by,
        not_drained=len(r.not_drained),
    )


_ID = re.compile(r"r(\d+)$")


def _order(region: str) -> int:
    m = _ID.match(region)
    return int(m.group(1)) if m else -1


def _merge(old: Iterable[RegionRecord], new: Iterable[RegionRecord]) -> tuple[RegionRecord, ...]:
    """Old and new records of one arbiter, by region id (a later record of an id wins), oldest first."""
    by_id = {r.region: r for r in old}
    by_id.update((r.region, r) for r in new)
    return tuple(sorted(by_id.values(), key=lambda r: _order(r.region))[-MAX_REGIONS:])


def _replace_gpu(state: NodeState, index: int, **changes: Any) -> NodeState:
    gpus = tuple(dataclasses.replace(g, **changes) if g.index == index else g for g in state.gpus)
    return dataclasses.replace(state, gpus=gpus)


class SessionEvent(msgspec.Struct, kw_only=True):
    """A ``krex.session`` event (``joined``, ``left``). Another user's, on a private arbiter, names
    only the user, GPU and role: its id is ''."""

    event: str = ""
    id: str = ""
    pid: int = 0
    user: str = ""
    role: str = ""
    name: str = ""
    gpu: int = -1
    within: str = ""
    since: float | None = None


class GateEvent(msgspec.Struct, kw_only=True):
    """A ``krex.gate`` event: a GPU's gate closed or opened."""

    gpu: int = -1
    closed: bool = False


class RegionEvent(RegionReport, kw_only=True):
    """A ``krex.region`` event: the region's report (what the event carries of it) and what
    happened (``requested``, ``granted``, ``intruder``, ``withdrawn``, ``released``)."""

    event: str = ""
    #: the processes that began GPU work during the region (``intruder``)
    pids: list[int] = []


def _session_event(state: NodeState, data: Mapping[str, Any], at: float) -> NodeState:
    state = _heard(state, at)
    e = msgspec.convert(data, SessionEvent, strict=False)
    sid = e.id
    if not sid:
        # Another user's session on a private arbiter: its event names only user, GPU and role
        # (no id to follow it by); the status polls count it under "other users".
        return state
    if e.event == "joined":
        g = state.gpu(e.gpu)
        if g is None or any(s.id == sid for s in g.sessions):
            return state
        info = SessionInfo(
            id=sid,
            pid=e.pid,
            user=e.user,
            role=e.role,
            name=e.name,
            gpu=g.index,
            within=e.within,
            since=at if e.since is None else e.since,
        )
        return _replace_gpu(state, g.index, sessions=(*g.sessions, info))
    if e.event == "left":
        # The arbiter withdraws what the session queued (and publishes "withdrawn" for each).
        gpus = tuple(
            dataclasses.replace(
                g,
                sessions=tuple(s for s in g.sessions if s.id != sid),
                queue=tuple(w for w in g.queue if w.session != sid),
            )
            for g in state.gpus
        )
        return dataclasses.replace(state, gpus=gpus)
    return state


def _gate_event(state: NodeState, data: Mapping[str, Any], at: float) -> NodeState:
    state = _heard(state, at)
    e = msgspec.convert(data, GateEvent, strict=False)
    g = state.gpu(e.gpu)
    if g is None:
        return state
    return _replace_gpu(state, g.index, gate_closed=e.closed)


def _region_event(state: NodeState, data: Mapping[str, Any], at: float) -> NodeState:
    state = _heard(state, at)
    r = msgspec.convert(data, RegionEvent, strict=False)
    kind, rid = r.event, r.region
    if kind == "intruder":
        for held in state.gpus:
            if held.holder is not None and held.holder.region == rid:
                more = held.holder.intruders + len(r.pids)
                return _replace_gpu(state, held.index, holder=dataclasses.replace(held.holder, intruders=more))
        return state
    g = state.gpu(r.gpu)
    if g is None:
        return state
    if kind == "requested":
        known = {w.region for w in g.queue} | {r.region for r in g.regions} | ({g.holder.region} if g.holder else set())
        if rid in known:
            return state
        s = state.session(r.session)
        waiter = Waiter(
            region=rid,
            session=r.session,
            pid=s.pid if s else 0,
            user=s.user if s else "",
            name=s.name if s else r.session,
            since=at,
        )
        return _replace_gpu(state, g.index, queue=(*g.queue, waiter))
    queue = tuple(w for w in g.queue if w.region != rid)
    if kind == "granted":
        if any(r.region == rid for r in g.regions):
            return _replace_gpu(state, g.index, queue=queue)  # a late event of a region already over
        s = state.session(r.session)
        granted = Holder(
            region=rid,
            session=r.session,
            pid=r.holder_pid,
            user=r.user,
            name=r.name,
            role=s.role if s else "",
            since=at,
            max_hold_s=r.max_hold_s,
            degraded=r.degraded,
            intruders=len(r.intruders),
            frozen=tuple(r.frozen),
        )
        return _replace_gpu(state, g.index, queue=queue, holder=granted, gate_closed=True)
    if kind == "withdrawn":  # left the queue before its grant (Ctrl-C, its session ended)
        return _replace_gpu(state, g.index, queue=queue)
    if kind == "released":
        still = None if g.holder is not None and g.holder.region == rid else g.holder
        return _replace_gpu(
            state,
            g.index,
            queue=queue,
            holder=still,
            regions=_merge(g.regions, [_record(r)]),
        )
    return state


def _lost(state: NodeState, data: Mapping[str, Any], at: float) -> NodeState:
    since = state.lost_since if state.lost_since is not None else at
    return dataclasses.replace(
        state, connected=False, lost_since=since, message=str(data.get("reason", "the arbiter does not answer"))
    )


_HANDLERS = {
    "snapshot": _snapshot,
    "telemetry": _telemetry,
    "session": _session_event,
    "gate": _gate_event,
    "region": _region_event,
    "lost": _lost,
}
