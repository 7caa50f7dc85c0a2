"""Sessions: the processes the arbiter knows, and how it learns that one died.

Liveness comes from the kernel, not from heartbeats: each session's pid is watched through a
pidfd registered with the event loop, which becomes readable the moment the process exits
(psutil polling every 50 ms where pidfds are missing). A dead session is reaped at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import psutil

from ..errors import InvalidRequest, PermissionDenied, UnknownSession
from ..node_status import SessionRow, SlurmJob
from ..procutil import real_and_effective_uid, start_time

log = logging.getLogger("krex.sessions")


@dataclass
class Session:
    id: str
    token: str
    pid: int
    start: int
    uid: int
    role: str
    name: str
    gpu: int
    control: bytes | None  # ROUTER identity of the socket that registered, for control messages
    within: str = ""  # the region this session is part of (started by its holder: KREX_REGION)
    cgroup: str = ""  # the cgroup v2 the arbiter placed it in (--cgroups auto), else ""
    #: it missed a drain and has not answered one since: regions do not wait for it (the drain
    #: timeout is spent once per silent session, not on every region); its next answer clears it
    silent: bool = False
    job: SlurmJob = field(default_factory=SlurmJob)  # its Slurm job, step and account (Arbiter.slurm)
    created: float = field(default_factory=time.time)

    @functools.cached_property
    def user(self) -> str:  # looked up once: every report and metric names it (a read of /etc/passwd)
        try:
            import pwd

            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return str(self.uid)

    def public(self) -> SessionRow:
        """The session as a status table lists it (what a privacy view may keep of it)."""
        row = SessionRow(
            id=self.id,
            pid=self.pid,
            uid=self.uid,
            user=self.user,
            role=self.role,
            name=self.name,
            gpu=self.gpu,
            within=self.within,
            cgroup=self.cgroup,
            since=self.created,
        )
        return msgspec.structs.replace(row, **msgspec.structs.asdict(self.job))


class SessionTable:
    """Registry of sessions; calls ``on_death(session)`` when a session's process exits."""

    def __init__(self, on_death: Callable[[Session], None]) -> None:
        self._on_death = on_death
        self._sessions: dict[str, Session] = {}
        self._by_pid: dict[int, list[Session]] = {}  # the sessions of each process
        self._fds: dict[str, int] = {}
        self._poll_task: asyncio.Task[None] | None = None
        self._counter = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(list(self._sessions.values()))

    def __len__(self) -> int:
        return len(self._sessions)

    def on_gpu(self, gpu: int) -> list[Session]:
        return [s for s in self._sessions.values() if s.gpu == gpu]

    def cgroup_of(self, pid: int) -> str:
        """The cgroup the arbiter placed session ``pid`` in ("" when none): asked for every
        sibling of every region, so looked up by pid, not through every session."""
        return next((s.cgroup for s in self._by_pid.get(pid, ()) if s.cgroup), "")

    def get(self, session_id: str, token: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None or not secrets.compare_digest(session.token, token):
            raise UnknownSession(
                f"session {session_id!r} is not registered (it ended, or the arbiter restarted): attach again"
            )
        return session

    def add(
        self, pid: int, uid: int, role: str, name: str, gpu: int, control: bytes | None, within: str = ""
    ) -> Session:
        start = start_time(pid)
        owner, effective = real_and_effective_uid(pid)
        if start is None or owner is None:
            raise InvalidRequest(f"process {pid} does not exist")
        if uid != 0 and owner != uid:
            raise PermissionDenied(f"process {pid} belongs to uid {owner}; you (uid {uid}) cannot register it")
        if owner != effective:
            raise PermissionDenied(
                f"process {pid} runs with real uid {owner} but effective uid {effective} "
                "(setuid): KREX registers only processes acting as themselves"
            )
        self._counter += 1
        session = Session(
            id=f"s{self._counter}-{secrets.token_hex(3)}",
            token=secrets.token_hex(16),
            pid=pid,
            start=start,
            uid=uid,
            role=role,
            name=name or f"{role}-{pid}",
            gpu=gpu,
            control=control,
            within=within,
        )
        self._sessions[session.id] = session
        self._by_pid.setdefault(pid, []).append(session)
        self._watch(session)
        return session

    def remove(self, session_id: str) -> Session | None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            others = [s for s in self._by_pid.pop(session.pid, []) if s is not session]
            if others:
                self._by_pid[session.pid] = others
        fd = self._fds.pop(session_id, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)
        return session

    def _watch(self, session: Session) -> None:
        loop = asyncio.get_running_loop()
        try:
            fd = os.pidfd_open(session.pid)
        except (AttributeError, OSError):
            if self._poll_task is None:
                self._poll_task = loop.create_task(self._poll())
            return
        self._fds[session.id] = fd
        loop.add_reader(fd, self._died, session.id)
        # The process may have exited between start_time() and pidfd_open(): check once.
        if start_time(session.pid) != session.start:
            loop.call_soon(self._died, session.id)

    def _died(self, session_id: str) -> None:
        session = self.remove(session_id)
        if session is not None:
            log.info("session %s (pid %d) exited", session.id, session.pid)
            self._on_death(session)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            for session in list(self._sessions.values()):
                if session.id not in self._fds and not _alive(session):
                    self._died(session.id)

    def close(self) -> None:
        for sid in list(self._fds):
            self.remove(sid)
        if self._poll_task:
            self._poll_task.cancel()


def _alive(session: Session) -> bool:
    try:
        return psutil.Process(session.pid).status() != psutil.STATUS_ZOMBIE and start_time(session.pid) == session.start
    except psutil.Error:
        return False
