"""The session and region requests of the arbiter: place, register, unregister, acquire, release
and drain acknowledgements. Called by the arbiter's :class:`~krex_lab.rpc_server.Service` (one
handler per request type, each answered exactly once) on the event loop; it works on the parts
the arbiter built (session table, scheduler, quotas, tickets, cgroup placer, notifier), never on
the arbiter itself.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import msgspec

from .. import protocol
from ..enforcement.cgroups import CgroupPlacer
from ..enforcement.freeze import FREEZE_FILES
from ..errors import InvalidRequest, NotHolder, PermissionDenied
from ..gpu import GpuBackend
from ..procutil import ancestors, proc_uid
from ..region_report import REVOKED
from ..rpc_server import DEFERRED, Handler, Peer
from .identity import Tickets
from .quotas import Quotas
from .region import BackendInfo, RegionState
from .scheduler import Scheduler
from .scheduler_config import Publisher
from .sessions import Session, SessionTable
from .slurm_jobs import SlurmJobs

log = logging.getLogger("krex.arbiter")


class Acknowledged(msgspec.Struct):
    """The empty answer to a request that returns nothing (``{}`` on the wire)."""


@dataclass(frozen=True)
class RequestLimits:
    """The arbiter options a request is checked against (see ``Arbiter`` for their meaning)."""

    max_hold: float
    max_hold_limit: float
    isolate_cores: int
    #: sessions the node can hold at once (from the arbiter's descriptor limit)
    capacity: int


class SessionRequests:
    """Handlers of the requests that make sessions and regions."""

    def __init__(
        self,
        backend: GpuBackend,
        sessions: SessionTable,
        scheduler: Scheduler,
        quotas: Quotas,
        tickets: Tickets,
        placer: CgroupPlacer,
        notify: Publisher,
        limits: RequestLimits,
        slurm: SlurmJobs | None = None,
    ) -> None:
        self.backend = backend
        self.gpu_count = backend.gpu_count()
        self.backend_info = backend.describe()
        #: what each report says of the backend
        self.reported_backend = BackendInfo.of(self.backend_info)
        self.sessions = sessions
        self.scheduler = scheduler
        self.quotas = quotas
        self.tickets = tickets
        self.placer = placer
        self.notify = notify
        self.limits = limits
        #: where the Slurm job of a registering session is looked up (Arbiter.slurm), else None
        self.slurm = slurm

    def handlers(self) -> dict[type, Handler]:
        """The service's handler of each request these answer."""
        return {
            protocol.Place: self.place_request,
            protocol.Register: self.register,
            protocol.Unregister: self.unregister,
            protocol.Acquire: self.acquire,
            protocol.Release: self.release,
            protocol.EndRegion: self.end_region,
            protocol.DrainAck: self.drain_ack,
        }

    def check_gpu(self, gpu: int) -> None:
        if not 0 <= gpu < self.gpu_count:
            raise InvalidRequest(f"GPU {gpu} does not exist: this node has GPUs 0..{self.gpu_count - 1}")

    def place(self) -> int:
        """Fewest sessions, then most free memory."""
        inventory = {g.index: g for g in self.backend.inventory()}
        counts = {g: len(self.sessions.on_gpu(g)) for g in range(self.gpu_count)}

        def key(g: int) -> tuple[int, int, int]:
            info = inventory.get(g)
            free = (info.memory_total - info.memory_used) if info else 0
            return (counts[g], -free, g)

        return min(range(self.gpu_count), key=key)

    def place_request(self, req: protocol.Place, peer: Peer) -> protocol.Placement:
        return protocol.Placement(self.place())

    def register(self, req: protocol.Register, peer: Peer) -> protocol.Registered:
        if req.role not in protocol.ROLES:
            raise InvalidRequest(f"unknown role {req.role!r}; one of {', '.join(protocol.ROLES)}")
        if len(req.name) > 200:
            raise InvalidRequest("a session name has at most 200 characters")
        gpu = self.place() if req.gpu is None else req.gpu
        self.check_gpu(gpu)
        who = self.tickets.redeem(req.ticket)
        uid = who.uid
        # pid 0: the process that asked for the ticket, as the kernel numbers it for us (a client in
        # a container knows only its own namespace's number).
        pid = who.pid if req.pid == 0 else req.pid
        self.quotas.check_register(uid, pid, self.sessions, self.limits.capacity)
        within = ""
        if req.within:
            # With ``via_ticket`` (workers/pool): a pool worker started for one job of a client
            # inside the region. The ticket is the client's own (the kernel named its pid and uid);
            # the worker joins the region only if that client is the holder itself or its
            # descendant, and the client, the worker and the holder are one user. A failed check
            # is refused (the pool then fails that job rather than run it frozen).
            region_id = req.within
            region = self.scheduler.find(region_id)
            if req.via_ticket:
                client = self.tickets.redeem(req.via_ticket)
                if (
                    region is None
                    or region.gpu != gpu
                    or not (client.uid == uid == region.session.uid)
                    or not (client.pid == region.session.pid or region.session.pid in ancestors(client.pid))
                ):
                    raise PermissionDenied(
                        f"process {client.pid} is not inside region {region_id} on GPU {gpu} "
                        "(not its holder or the holder's descendant of the same user, or the region has ended)"
                    )
                within = region_id
            # Only a descendant of a live region's holder is part of it; a stale or false
            # claim (an inherited KREX_REGION) just makes an ordinary session.
            elif region is not None and region.session.pid in ancestors(pid):
                within = req.within
        session = self.sessions.add(pid, uid, req.role, req.name, gpu, peer.identity if req.control else None, within)
        session.cgroup = self.placer.place(session.id, session.pid)
        if self.slurm is not None:
            session.job = self.slurm.job_of(session.pid, session.uid)
        self.notify.publish("session", {"event": "joined", **msgspec.to_builtins(session.public())})
        self.scheduler.intruder_session(session)
        return protocol.Registered(session=session.id, token=session.token, gpu=gpu, **self.backend_info)

    def unregister(self, req: protocol.Unregister, peer: Peer) -> protocol.Ended:
        session = self.sessions.get(req.session, req.token)
        self.sessions.remove(session.id)
        self.session_gone(session, "session ended")
        return protocol.Ended(session.id)

    def session_died(self, session: Session) -> None:
        self.session_gone(session, "holder process exited")

    def session_gone(self, session: Session, reason: str) -> None:
        self.scheduler.session_gone(session, reason)
        if session.cgroup:
            # A region holding it frozen still thaws it: thaw() opens the files again if need be.
            FREEZE_FILES.forget(session.cgroup)
        self.placer.remove(session.cgroup)
        self.notify.publish("session", {"event": "left", **msgspec.to_builtins(session.public())})

    def acquire(self, req: protocol.Acquire, peer: Peer) -> Any:
        session = self.sessions.get(req.session, req.token)
        gpu = session.gpu if req.gpu is None else req.gpu
        self.check_gpu(gpu)
        max_hold = self.limits.max_hold if req.max_hold is None else req.max_hold
        if not 0 < max_hold <= self.limits.max_hold_limit:
            raise InvalidRequest(f"max_hold must be in (0, {self.limits.max_hold_limit:g}] seconds, not {max_hold}")
        cores = self.limits.isolate_cores if req.cores is None else req.cores
        if not 0 <= cores <= 1024:
            raise InvalidRequest(f"cores must be between 0 and 1024, not {cores}")
        parent = self.scheduler.holder(gpu)
        if parent is not None and session.within == parent.id and parent.state is RegionState.HELD:
            # Started by the holder inside its region (krex exclusive -- CMD): the region is
            # already theirs; queueing behind it would wait for ourselves.
            report = parent.report(self.reported_backend)
            report.nested = True
            return protocol.Granted(region=parent.id, gpu=gpu, report=report)
        mine = self.scheduler.regions_of(session, gpu)
        if mine:
            raise InvalidRequest(f"session {session.id} already holds or waits for {mine[0].id} on GPU {gpu}")
        if len(req.exempt) > 16:
            raise InvalidRequest("at most 16 exempt processes")
        for pid in req.exempt:
            owner = proc_uid(pid)
            if owner is None:
                raise InvalidRequest(f"exempt process {pid} does not exist")
            if session.uid != 0 and owner != session.uid:
                raise PermissionDenied(f"process {pid} belongs to uid {owner}: a region may only exempt its own user's")
        lease = self.quotas.check_acquire(session.uid, max_hold, self.scheduler.waiting())
        if req.isolate and req.cores is not None:  # the operator's isolate_cores is not the user's ask
            self.quotas.check_cores(session.uid, cores)
        spec = msgspec.structs.replace(req.spec, gpu=gpu, max_hold=lease, cores=cores)
        region = self.scheduler.request(session, spec, peer.reply)
        if lease < max_hold:
            region.capped_from = max_hold
        return DEFERRED

    def release(self, req: protocol.Release, peer: Peer) -> Any:
        session = self.sessions.get(req.session, req.token)
        region = self.scheduler.find(req.region)
        if region is None:
            past = self.scheduler.past(req.region)
            if past is not None and past.session == session.id:
                return past  # already released (lease expiry): the report says why
            raise NotHolder(f"region {req.region!r} is not held or requested by session {session.id}")
        if session.within == region.id and region.session.id != session.id:
            report = region.report(self.reported_backend)
            report.nested = True  # the holder releases it
            return report
        if region.session.id != session.id and req.force:
            return self._revoke(region, session.uid, f"session {session.id}")
        if region.session.id != session.id:
            raise NotHolder(f"region {req.region} belongs to another session; only its holder can release it")
        if req.leave:
            return self._release_and_leave(session, region)
        return self.scheduler.release(region, "released by holder")

    async def _release_and_leave(self, session: Session, region: Any) -> Any:
        # Out of the table before the release grants the next region: not its sibling.
        self.sessions.remove(session.id)
        try:
            return await self.scheduler.release(region, "released by holder")
        finally:
            self.session_gone(session, "session ended")

    def end_region(self, req: protocol.EndRegion, peer: Peer) -> Any:
        """An admin ends (or withdraws) any region, named by an identity ticket: no session of its
        own, so the admin page is never a sibling that regions drain or freeze."""
        uid = self.tickets.redeem(req.ticket).uid
        region = self.scheduler.find(req.region)
        if region is None:
            raise NotHolder(f"region {req.region!r} is not held or requested")
        return self._revoke(region, uid, "an identity ticket")

    def _revoke(self, region: Any, uid: int, by: str) -> Any:
        if not self.quotas.is_admin(uid):
            raise PermissionDenied(
                f"only root and members of group {self.quotas.admin_group!r} may end another session's region"
            )
        log.warning("region %s of %s ended by admin uid %d (%s)", region.id, region.session.user, uid, by)
        return self.scheduler.release(region, f"{REVOKED} uid {uid}")

    def drain_ack(self, req: protocol.DrainAck, peer: Peer) -> Acknowledged:
        session = self.sessions.get(req.session, req.token)
        session.silent = False  # it answers again: regions wait for it again
        region = self.scheduler.find(req.region)
        fut = region.acks.get(session.id) if region is not None else None
        if fut is not None and not fut.done():
            fut.set_result(None)
        return Acknowledged()
