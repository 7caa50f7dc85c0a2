"""A region: one session's claim on one GPU, from its request to its release.

A region moves through :class:`RegionState` along :data:`TRANSITIONS`, written once here::

    QUEUED ──▶ GRANTING ──▶ HELD ──▶ RELEASING ──▶ RELEASED
       │           └──────────────────────▲
       └───────────────── (withdrawn) ────────────────▶ RELEASED

``GRANTING`` goes straight to ``RELEASING`` when an enforcement step fails (everything done so
far is undone) or when the holder went away while it was being granted.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..enforcement.drain import DrainResult
from ..enforcement.freeze import FreezeResult
from ..enforcement.isolate import IsolateResult
from ..enforcement.shield import ShieldResult
from ..errors import KrexError
from ..procutil import ancestors
from ..protocol import RegionSpec
from ..region_report import REVOKED, RegionReport
from .sessions import Session

Reply = Callable[[Any, "KrexError | None"], None]


class RegionState(enum.Enum):
    QUEUED = "queued"  # waiting in its GPU's queue
    GRANTING = "granting"  # gate closed, enforcement steps running
    HELD = "held"  # granted: the holder has the GPU
    RELEASING = "releasing"  # enforcement being undone
    RELEASED = "released"  # done (granted and released, withdrawn, or failed)


TRANSITIONS: dict[RegionState, frozenset[RegionState]] = {
    RegionState.QUEUED: frozenset({RegionState.GRANTING, RegionState.RELEASED}),
    RegionState.GRANTING: frozenset({RegionState.HELD, RegionState.RELEASING}),
    RegionState.HELD: frozenset({RegionState.RELEASING}),
    RegionState.RELEASING: frozenset({RegionState.RELEASED}),
    RegionState.RELEASED: frozenset(),
}


class _Capabilities(msgspec.Struct):
    lock: bool = False


class _Described(msgspec.Struct):
    """The part of a backend's ``describe()`` a report carries."""

    backend: str = "unknown"
    simulated: bool = True
    capabilities: _Capabilities = msgspec.field(default_factory=_Capabilities)


class BackendInfo(msgspec.Struct, kw_only=True, frozen=True):
    """What every region report says of the arbiter's GPU backend."""

    backend: str = "unknown"
    simulated: bool = True
    #: whether the backend can lock a process's GPU work (its ``capabilities.lock``)
    lock_capable: bool = False

    @classmethod
    def of(cls, described: object) -> BackendInfo:
        """From a backend's ``describe()`` as it comes (None: no backend, a scheduler built alone)."""
        if described is None:
            return cls()
        d = msgspec.convert(described, _Described)
        return cls(backend=d.backend, simulated=d.simulated, lock_capable=d.capabilities.lock)


@dataclass
class Region:
    id: str
    gpu: int
    session: Session
    #: what was asked, with the arbiter's defaults filled in (``max_hold``, ``cores``)
    spec: RegionSpec
    reply: Reply
    requested: float = field(default_factory=time.monotonic)
    state: RegionState = RegionState.QUEUED
    granted_at: float = 0.0
    released_by: str = ""
    drain: DrainResult = field(default_factory=DrainResult)
    frozen: FreezeResult = field(default_factory=FreezeResult)
    isolated: IsolateResult = field(default_factory=IsolateResult)
    shielded: ShieldResult = field(default_factory=ShieldResult)
    #: never stopped or moved by the region (the holder, its ancestors, exempt clients)
    exempt: set[int] = field(default_factory=set)
    #: never drained (the holder's own process tree and the arbiter's processes)
    drain_exempt: set[int] = field(default_factory=set)
    times: dict[str, float] = field(default_factory=dict)
    lease: asyncio.TimerHandle | None = None
    watcher: asyncio.Future[Any] | None = None
    acks: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    release_wanted: str = ""
    locking: bool = False
    #: the lease asked for, where the user's max_hold quota capped it (max_hold is the cap)
    capped_from: float | None = None
    #: grants to other users made while this region waited (fair share's turns)
    passed: int = 0
    watch_errors: list[str] = field(default_factory=list)
    #: sessions that exited, or ended their session, while being drained (nothing left to drain)
    gone: list[int] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def max_hold(self) -> float:
        return self.spec.max_hold or 0.0

    @property
    def freeze(self) -> bool:
        return self.spec.freeze

    @property
    def isolate(self) -> bool:
        return self.spec.isolate

    @property
    def cores(self) -> int:
        return self.spec.cores or 0

    async def timed(self, step: str, job: Awaitable[object]) -> None:
        """Await ``job`` and keep how long it took in :attr:`times` (the report's ``<step>_s``)."""
        t0 = time.monotonic()
        try:
            await job
        finally:
            self.times[step] = time.monotonic() - t0

    def move(self, new: RegionState) -> None:
        """Change state along one of :data:`TRANSITIONS` (anything else is a bug: raise)."""
        if new not in TRANSITIONS[self.state]:
            raise RuntimeError(f"region {self.id}: no transition {self.state.value} -> {new.value}")
        self.state = new

    def exempts(self, pid: int, sessions: set[int]) -> bool:
        """Is ``pid`` part of the holder (decided when it is found, so what the holder starts
        after the grant counts too)? A registered session below the holder is not: it is a
        session of its own, frozen like any other (``sessions``: pids of the other sessions)."""
        if pid in self.exempt:
            return True
        chain = [pid, *ancestors(pid)]
        if self.session.pid not in chain:
            return False
        below = chain[: chain.index(self.session.pid)]
        return not any(p in sessions for p in below)

    def report(self, backend: BackendInfo) -> RegionReport:
        intruded = self.shielded.beyond_bound()
        degraded = bool(self.drain.not_drained or self.frozen.failed or self.isolated.failed or intruded)
        report = RegionReport(
            region=self.id,
            gpu=self.gpu,
            session=self.session.id,
            holder_pid=self.session.pid,
            uid=self.session.uid,
            user=self.session.user,
            name=self.session.name,
            slurm_job=self.session.job.slurm_job,
            slurm_step=self.session.job.slurm_step,
            account=self.session.job.account,
            state=self.state.value,
            exempted=list(self.spec.exempt),
            max_hold_s=self.max_hold,
            max_hold_asked_s=self.capped_from,
            drained=sorted(set(self.drain.acked) | set(self.drain.locked_pids)),
            locked=self.drain.locked_pids + [p for p, _ in self.drain.late],
            no_lock_needed={str(k): v for k, v in self.drain.unlocked_ok.items()},
            not_drained={str(k): v for k, v in self.drain.not_drained.items()},
            gone=list(self.gone),
            intruders=list(self.drain.intruders),
            frozen=self.frozen.all_pids(),
            frozen_cgroups=list(self.frozen.cgroups),
            skipped_stopped=list(self.frozen.skipped),
            moved=list(self.isolated.moved_pids),
            cores=list(self.isolated.cores),
            shield=self.shielded.report(),
            failures=self.frozen.failed + self.isolated.failed + self.watch_errors + intruded,
            degraded=degraded,
            expired=self.released_by == "lease expired",
            revoked=self.released_by.startswith(REVOKED),
            released_by=self.released_by,
            backend=backend.backend,
            simulated=backend.simulated,
            lock_capable=backend.lock_capable,
        )
        # Each step's time as its field (a step with no field is an AttributeError here, not a lost time).
        for step, seconds in self.times.items():
            setattr(report, f"{step}_s", round(seconds, 6))
        return report
