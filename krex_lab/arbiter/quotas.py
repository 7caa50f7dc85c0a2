"""Fairness and quotas: how much of the node one user (or one process) may take, in one place.

:class:`Quotas` is configured like the arbiter (traitlets: ``c.Quotas.sessions_per_user = 64``,
per-user and per-group overrides, an admin group). It answers three questions for the
arbiter's handlers: may this process register another session, may this user queue another
request (each refusal a :class:`~krex_lab.errors.QuotaExceeded` naming the user and the limit),
and how long may this user hold a GPU (a longer lease is capped at the user's ``max_hold``, not
refused: the region's report says so). :meth:`Quotas.reload` applies an edited config file
without a restart (the arbiter does it on SIGHUP). Members of the admin group (and root) are
exempt and may end any region.

:class:`~.fairshare.FairShare` (its own module) is the scheduler's queue policy.
"""

from __future__ import annotations

import dataclasses
import grp
import logging
import os
import pwd
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from traitlets import Dict, Float, Int, Unicode, default
from traitlets.config import LoggingConfigurable

from ..errors import QuotaExceeded
from ..procfiles import KeptFiles
from .region import Region

log = logging.getLogger("krex.arbiter")

#: file descriptors kept free for sockets, the journal, NVML and the like
FD_RESERVE = 256
#: descriptors one session costs: its pidfd and its control connection (and, placed in a cgroup,
#: the freeze, events and procs files the region sequence keeps of it: enforcement/freeze.FreezeFiles)
FDS_PER_SESSION = 2
FDS_PER_PLACED_SESSION = FDS_PER_SESSION + 3


#: the default longest lease per user on a multi-user arbiter (Quotas.max_hold)
MULTI_USER_MAX_HOLD = 600.0


@dataclass(frozen=True)
class Limits:
    sessions_per_user: int
    sessions_per_process: int
    queued_per_user: int
    max_hold: float
    max_cores: int = 0


def kept_files_limit(fd_limit: int) -> int:
    """Descriptors of /proc files the region sequence may keep (procfiles.KeptFiles.limit): a
    quarter of the limit, at least :attr:`KeptFiles.LIMIT`. Each session root keeps three or four
    (pidfd, stat, children, cgroup): 512 in all kept half of 504 siblings' files, and every other
    read cost an open and a close (benchmarks/regions/scale.py, 2026-12-02)."""
    return max(KeptFiles.LIMIT, fd_limit // 4)


def node_session_capacity(fd_limit: int, placed: bool = False) -> int:
    """Sessions the arbiter takes before it would run short of descriptors (it refuses beyond);
    ``placed``: sessions are placed in cgroups (``--cgroups auto``)."""
    per_session = FDS_PER_PLACED_SESSION if placed else FDS_PER_SESSION
    return max(16, (fd_limit - FD_RESERVE - kept_files_limit(fd_limit)) // per_session)


#: the limits a group or a user entry may set (each also an option of :class:`Quotas`)
_FIELDS = frozenset(f.name for f in dataclasses.fields(Limits))


class Quotas(LoggingConfigurable):
    sessions_per_user = Int(128, help="Sessions one user may have registered at once (all GPUs).").tag(config=True)
    sessions_per_process = Int(
        8, help="Sessions registered for one process (a kernel needs one; each holds a descriptor of the arbiter)."
    ).tag(config=True)
    queued_per_user = Int(8, help="Requests one user may have waiting in the GPUs' queues at once.").tag(config=True)
    max_hold = Float(
        help="Longest lease (max_hold, seconds) one user may ask for; 0: only Arbiter.max_hold_limit applies. "
        "Default: 600 (10 minutes) on a multi-user arbiter, where one region stops everyone else on its "
        "GPU; 0 otherwise."
    ).tag(config=True)

    @default("max_hold")
    def _max_hold_default(self) -> float:
        return MULTI_USER_MAX_HOLD if getattr(self.parent, "multi_user", False) else 0.0

    max_cores = Int(
        help="Most cores one region of this user may reserve (the `cores` of a request; everyone else "
        "is kept off them for the region's hold); 0: no per-user cap. Default: an eighth of the node "
        "(at least 1) on a multi-user arbiter, 0 otherwise."
    ).tag(config=True)

    @default("max_cores")
    def _max_cores_default(self) -> int:
        return max(1, (os.cpu_count() or 1) // 8) if getattr(self.parent, "multi_user", False) else 0

    connections_per_user = Int(
        256,
        help="Connections one user may keep open to each of the arbiter's sockets (requests, events); "
        "beyond it a new one is closed at once and the user logged once per burst. Each session "
        "holds one; 0: no per-user cap (the node-wide caps from the descriptor limit still apply).",
    ).tag(config=True)
    connections = Int(
        0,
        help="Connections everyone together may keep open to each of the arbiter's sockets; 0: half "
        "of what the descriptor limit leaves after the headroom the arbiter keeps free.",
    ).tag(config=True)
    users = Dict(
        help="Per-user overrides, by user name: {'alice': {'queued_per_user': 32, 'max_hold': 3600}}. "
        "Keys are the option names of this class."
    ).tag(config=True)
    groups = Dict(
        help="Per-group overrides, by group name, same keys as `users`; a user in several groups gets "
        "the most generous value of each. A user's own entry in `users` wins over groups."
    ).tag(config=True)
    admin_group = Unicode(
        "krex-admin",
        help="Members of this Unix group (and root) are exempt from every quota and "
        "may end any region or withdraw any request.",
    ).tag(config=True)
    region_overhead = Float(
        0.02,
        help="Seconds fair share charges each region at least for what it costs the others beyond its "
        "hold (its grant drains and freezes them, its release gives it back); the measured acquire "
        "and release are charged when they are more.",
    ).tag(config=True)
    half_life = Float(
        600.0,
        help="Half-life in seconds of the hold time that fair share counts: the user who held "
        "GPUs least over roughly this long goes first.",
    ).tag(config=True)

    def _base(self) -> Limits:
        return Limits(
            self.sessions_per_user, self.sessions_per_process, self.queued_per_user, self.max_hold, self.max_cores
        )

    def limits_for(self, uid: int) -> Limits:
        name, groups = _user_and_groups(uid)
        best: dict[str, float] = {}
        for group in groups:
            for key, value in dict(self.groups.get(group, {})).items():
                if key in _FIELDS:
                    current = best.get(key)
                    best[key] = value if current is None else _more_generous(key, current, value)
        best.update({k: v for k, v in dict(self.users.get(name, {})).items() if k in _FIELDS})
        return Limits(**{**dataclasses.asdict(self._base()), **best})

    def is_admin(self, uid: int) -> bool:
        if uid == 0:
            return True
        _, groups = _user_and_groups(uid)
        return self.admin_group in groups

    # -- the checks the arbiter's handlers make ---------------------------------------------------
    def check_register(self, uid: int, pid: int, sessions: Iterable[Any], capacity: int) -> None:
        every = list(sessions)
        if len(every) >= capacity:
            raise QuotaExceeded(
                f"the arbiter is at its capacity of {capacity} sessions (node limit, from its "
                "file descriptor limit): try again when sessions end"
            )
        if self.is_admin(uid):
            return
        limits = self.limits_for(uid)
        mine = sum(1 for s in every if s.uid == uid)
        if mine >= limits.sessions_per_user:
            raise QuotaExceeded(
                f"user {user_name(uid)} has {_count(mine, 'session')}: the limit is "
                f"sessions_per_user={limits.sessions_per_user}"
            )
        same_pid = sum(1 for s in every if s.pid == pid)
        if same_pid >= limits.sessions_per_process:
            raise QuotaExceeded(
                f"process {pid} has {_count(same_pid, 'session')}: the limit is sessions_per_process="
                f"{limits.sessions_per_process}"
            )

    def check_cores(self, uid: int, cores: int) -> None:
        """A region may not keep everyone else off more than this user's share of the node's cores."""
        if self.is_admin(uid):
            return
        limit = self.limits_for(uid).max_cores
        if limit > 0 and cores > limit:
            raise QuotaExceeded(f"cores {cores} is over this user's limit max_cores={limit}")

    def check_acquire(self, uid: int, max_hold: float, queued: Sequence[Region]) -> float:
        """The lease this user gets for ``max_hold``: capped at the user's ``max_hold`` limit (a
        course's 20 s quota must not fail every region that asks the arbiter's 60 s default);
        :class:`QuotaExceeded` when the user already waits for ``queued_per_user`` regions."""
        if self.is_admin(uid):
            return max_hold
        limits = self.limits_for(uid)
        waiting = sum(1 for r in queued if r.session.uid == uid)
        if waiting >= limits.queued_per_user:
            raise QuotaExceeded(
                f"user {user_name(uid)} already has {_count(waiting, 'request')} waiting: the limit is "
                f"queued_per_user={limits.queued_per_user}"
            )
        if limits.max_hold > 0 and max_hold > limits.max_hold:
            return float(limits.max_hold)
        return max_hold

    def reload(self, config: Any) -> list[str]:
        """Take every option of this class from ``config`` (a traitlets ``Config``: the file read
        again, the command line over it), dropping what the file no longer sets; returns the options
        that changed. Group memberships are looked up again at once."""
        fresh = Quotas(config=config)
        changed = []
        for name in self.trait_names(config=True):
            new = getattr(fresh, name)
            if getattr(self, name) != new:
                setattr(self, name, new)
                changed.append(name)
        _groups_seen.clear()
        return changed

    def reload_from(self, config: Any, source: str) -> str:
        """:meth:`reload` from ``source``'s ``config`` (read again on SIGHUP), logged; returns the
        line ``krex status`` shows. A value traitlets refuses changes nothing: the old quotas stay."""
        at = time.strftime("%H:%M:%S")
        try:
            changed = self.reload(config)
        except Exception as exc:
            note = f"reload from {source} failed at {at} ({exc}): the earlier quotas stay"
            log.error("quotas: %s", note)
            return note
        note = f"reloaded from {source} at {at} ({', '.join(changed) if changed else 'nothing changed'})"
        log.warning("quotas %s", note)
        return note


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def user_name(uid: int) -> str:
    """The user's name (the uid where it has none), for messages."""
    return _user_and_groups(uid)[0]


def _more_generous(key: str, a: float, b: float) -> float:
    if key in ("max_hold", "max_cores") and (a == 0 or b == 0):
        return 0  # 0 means "no per-user cap"
    return max(a, b)


#: seconds a user's name and groups are remembered: reading every group of the node (getgrall,
#: an LDAP query on some hosts) on the event loop at each register and acquire would stall it
#: for everyone; a group change takes effect within this long
GROUPS_TTL = 30.0
_groups_seen: dict[int, tuple[float, tuple[str, set[str]]]] = {}


def _user_and_groups(uid: int) -> tuple[str, set[str]]:
    now = time.monotonic()
    seen = _groups_seen.get(uid)
    if seen is not None and now - seen[0] < GROUPS_TTL:
        return seen[1]
    found = _lookup_user_and_groups(uid)
    if len(_groups_seen) > 4096:  # bounded: uids come from the kernel, but a node may have many
        _groups_seen.clear()
    _groups_seen[uid] = (now, found)
    return found


def _lookup_user_and_groups(uid: int) -> tuple[str, set[str]]:
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return str(uid), set()
    groups = {g.gr_name for g in grp.getgrall() if entry.pw_name in g.gr_mem}
    try:
        groups.add(grp.getgrgid(entry.pw_gid).gr_name)
    except KeyError:
        pass
    return entry.pw_name, groups
