"""Step 5, node-wide: a region's reserved cores run its holder and nothing else that can move.

:class:`~krex_lab.enforcement.isolate.CoreBook` pins the holder's threads to the reserved cores. What
keeps *everyone else* off them is chosen once, when the arbiter starts (``Arbiter.shield``):

* ``cpuset`` -- one operation: the holder's processes move into ``<v2 root>/krex-shield-<region>``,
  a cgroup v2 *partition root* whose cpus are the reserved cores. The kernel then takes those
  cores away from every other cgroup of the node (their ``cpuset.cpus.effective`` shrinks and
  every task's allowed CPUs with it) and gives them back when the partition goes. Needs the
  cpuset controller at the hierarchy's root and an arbiter that may write there (root, no
  cgroup namespace of its own). A holder whose cgroup limits memory, CPU, pids, I/O or cpusets
  stays where it is (moving it would lift those limits): that region falls back to affinities.
* ``affinity`` -- every thread of every user-space process of the node is moved off the reserved
  cores by the core book (original affinities journaled first, restored exactly).
* ``sessions`` -- only KREX sessions' threads move (the behaviour before the shield existed).

``auto`` picks ``cpuset`` where it works, else ``affinity``. With ``irqs`` (``Arbiter.shield_irqs``),
IRQ affinities that include a reserved core are narrowed to the other cores where ``/proc/irq`` is
writable (opt-in: it has run only against a stand-in tree so far). Kernel
threads are never moved (per-CPU ones cannot be) and are counted in the report. Everything is
journaled before it is done; :func:`undo_partitions` and :func:`restore_irqs` replay it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..procutil import flags_and_start, proc_uid, same_process, start_time
from ..region_report import ShieldIntrusion, ShieldReport
from .cgroups import cgroup_of, limits_on, v2_root

log = logging.getLogger("krex.shield")

MODES = ("auto", "cpuset", "affinity", "sessions")
PREFIX = "krex-shield-"
_PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread
_IRQ_ROOT = Path("/proc/irq")

RecordFn = Callable[..., None]  # Journal.record(kind, region, **data)


@dataclass
class ShieldResult:
    mode: str = "sessions"
    #: the partition cgroup (cpuset mode), "" where none was made
    partition: str = ""
    #: processes whose threads were moved off the reserved cores by affinity
    processes: int = 0
    kernel_threads: int = 0
    irqs_moved: int = 0
    #: boot ticks when the shield went up: what starts later inherited it (see CoreBook.widen_born)
    since: int = 0
    #: the node walk's user processes (pid -> start time): the release walk reads only new ones
    walked: dict[int, int] = field(default_factory=dict)
    #: when the node walk this shield stands on was made (monotonic; an adopted shield's is older)
    walked_at: float = 0.0
    #: the lingering shield this one took over ("" when it walked the node itself)
    adopted: str = ""
    #: the name under which this shield stays up after the region, for the next to adopt
    lingers: str = ""
    #: why something could not be shielded (not a failure of the region: said in the report)
    notes: list[str] = field(default_factory=list)
    #: what the affinity watch put back (see enforcement/watch.py), longest first
    intrusions: list[Any] = field(default_factory=list)
    #: seconds on the reserved cores past which an intrusion degrades the region
    intrusion_bound: float = 0.0

    def beyond_bound(self) -> list[str]:
        """Each intrusion longer than the bound, in words (the region is degraded by them)."""
        return [
            f"process {i.pid} ({_user(i.uid)}) was on the reserved cores {i.seconds:.3f} s ({i.times} times put back)"
            for i in self.intrusions
            if i.seconds > self.intrusion_bound
        ]

    def report(self) -> ShieldReport:
        return ShieldReport(
            intrusions=[
                ShieldIntrusion(pid=i.pid, user=_user(i.uid), times=i.times, seconds=round(i.seconds, 4))
                for i in self.intrusions
            ],
            mode=self.mode,
            partition=self.partition,
            adopted=self.adopted,
            lingers=self.lingers,
            processes=self.processes,
            kernel_threads_left=self.kernel_threads,
            irqs_moved=self.irqs_moved,
            notes=list(self.notes),
        )


def _user(uid: int) -> str:
    import pwd

    if uid < 0:  # it ended before it could be looked at
        return ""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


#: pids seen to be kernel threads, and when: a region walks the node twice, and most of a quiet
#: node's pids are kernel threads. Looked at again after _KTHREAD_TTL seconds, so that a pid
#: reused by a user process (pid_max wraps slowly) is not mistaken for long.
_kthreads: dict[int, float] = {}
_KTHREAD_TTL = 10.0


def node_pids(
    skip: set[int], uid: int | None = None, known: dict[int, int] | None = None
) -> tuple[dict[int, int], int, int]:
    """Every user-space process of the node not in ``skip`` (of user ``uid`` only, if given: a
    non-root arbiter cannot move others') with its start time, and how many kernel threads and
    other users' processes were left out. One stat read per process tells a kernel thread and
    names the process: the core book journals its threads under it (a read per *thread* cost
    15 us each, most of an affinity shield's time). Processes in ``known`` (an earlier walk's
    result) are taken from it unread: a pid reused since is a process born meanwhile, which
    the caller tells by its threads' start times."""
    procs: dict[int, int] = {}
    kernel = foreign = 0
    now = time.monotonic()
    if len(_kthreads) > 1 << 16:  # kernel threads come and go (kworkers): forget the dead now and then
        _kthreads.clear()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in skip:
            continue
        if known is not None and pid in known:
            procs[pid] = known[pid]
            continue
        if now - _kthreads.get(pid, -_KTHREAD_TTL) < _KTHREAD_TTL:
            kernel += 1
            continue
        flags, start = flags_and_start(pid)
        if flags is None or start is None:  # gone
            continue
        if pid == 2 or flags & _PF_KTHREAD:
            _kthreads[pid] = now
            kernel += 1
            continue
        if uid is not None and proc_uid(pid) != uid:
            foreign += 1
            continue
        procs[pid] = start
    return procs, kernel, foreign


def _cpulist(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def parse_cpulist(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class CpusetPartition:
    """cgroup v2 partition roots for regions (see the module docstring)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else v2_root()
        self.reason = ""
        self._made: dict[str, tuple[Path, list[list[Any]]]] = {}
        if self.root is None:
            self.reason = "no cgroup v2 hierarchy is mounted"
            return
        if root is None and os.geteuid() != 0:  # a partition is made at the hierarchy's root
            self.reason = "only root may make cpuset partitions"
            return
        try:
            if "cpuset" not in (self.root / "cgroup.controllers").read_text().split():
                self.reason = f"the cpuset controller is not available at {self.root}"
                return
            if "cpuset" not in (self.root / "cgroup.subtree_control").read_text().split():
                _write(self.root / "cgroup.subtree_control", "+cpuset")
            if cgroup_of(os.getpid()) is None:
                self.reason = "this process is in no cgroup v2"
                return
        except OSError as exc:
            self.reason = f"cannot use cpusets at {self.root}: {exc.strerror or exc}"
            return

    @property
    def available(self) -> bool:
        return not self.reason

    def take(self, region: str, cores: set[int], pids: list[int], record: RecordFn) -> str:
        """Make the partition and move ``pids`` into it; returns "" or why it could not (undone)."""
        assert self.root is not None
        procs: list[list[Any]] = []
        for pid in pids:
            where, start = cgroup_of(pid), start_time(pid)
            if where is None or start is None:
                continue
            limits = limits_on(self.root, where)
            if limits:
                return f"the holder's cgroup {where} sets limits ({', '.join(sorted(limits))}) a partition would lift"
            procs.append([pid, start, where])
        path = self.root / f"{PREFIX}{region}"
        # Journaled before anything is made, so that a crash at any point below is undone.
        record("partition", region, path=str(path), procs=procs)
        try:
            path.mkdir()
            _write(path / "cpuset.cpus", _cpulist(cores))
            _write(path / "cpuset.mems", (self.root / "cpuset.mems.effective").read_text().strip())
            _write(path / "cpuset.cpus.partition", "root")
            state = (path / "cpuset.cpus.partition").read_text().strip()
            if state != "root":  # e.g. "root invalid (...)": the parent is no partition root
                raise OSError(errno.EINVAL, f"partition refused: {state}")
            for pid, _, _ in procs:
                with contextlib.suppress(ProcessLookupError):
                    _write(path / "cgroup.procs", str(pid))
        except OSError as exc:
            self._made[region] = (path, procs)
            self.give_back(region)
            return f"cpuset partition failed: {exc.strerror or exc}"
        self._made[region] = (path, procs)
        return ""

    def give_back(self, region: str) -> list[str]:
        made = self._made.pop(region, None)
        if made is None:
            return []
        return undo_partition(made[0], made[1])


def _is_shield_path(path: Path, root: Path) -> bool:
    return path.parent == root and path.name.startswith(PREFIX) and "/" not in path.name and ".." not in path.name


def _cgroup_dir(root: Path, relative: str) -> Path | None:
    """``relative`` (as /proc/PID/cgroup names it) under ``root``, if it is a real directory there."""
    target = Path(os.path.normpath(root / relative.lstrip("/")))
    if target != root and root not in target.parents:
        return None
    if os.path.realpath(target) != str(target) or not target.is_dir():
        return None
    return target


def undo_partition(path: Path, procs: list[list[Any]], root: Path | None = None) -> list[str]:
    """Move the holder's processes back where they were (and anything born in the partition to
    where the holder was), end the partition and remove it. Idempotent; never raises."""
    root = root if root is not None else v2_root()
    if root is None or not _is_shield_path(path, root):
        return [f"{path} is not a KREX shield partition"]
    errors: list[str] = []
    home = None
    for pid, start, where in procs:
        back = _cgroup_dir(root, str(where))
        home = home or back
        if back is None or not same_process(int(pid), start):
            continue
        try:
            _write(back / "cgroup.procs", str(pid))
        except OSError as exc:
            if exc.errno != errno.ESRCH:
                errors.append(f"move {pid} back to {where}: {exc.strerror}")
    home = home or root
    with contextlib.suppress(OSError):
        for line in (path / "cgroup.procs").read_text().split():
            try:
                _write(home / "cgroup.procs", line)
            except OSError as exc:
                if exc.errno != errno.ESRCH:
                    errors.append(f"move {line} out of {path.name}: {exc.strerror}")
    with contextlib.suppress(OSError):
        _write(path / "cpuset.cpus.partition", "member")
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        errors.append(f"remove {path}: {exc.strerror}")
    return errors


def undo_partitions(records: Iterable[tuple[str, list[list[Any]]]]) -> int:
    """Journal replay: undo every (path, procs) recorded. Returns how many partitions went."""
    n = 0
    for path, procs in records:
        errors = undo_partition(Path(path), procs)
        if errors:
            log.warning("undoing %s: %s", path, "; ".join(errors))
        n += 1
    return n


class IrqShield:
    """Narrows IRQ affinities that include reserved cores (journaled; restored at release)."""

    def __init__(self, root: Path = _IRQ_ROOT) -> None:
        self.root = root
        self._moved: dict[str, list[list[Any]]] = {}
        self.reason = "" if os.access(root / "default_smp_affinity", os.W_OK) else f"{root} is not writable here"

    def take(self, region: str, cores: set[int], cpus: set[int], record: RecordFn) -> tuple[int, str]:
        if self.reason:
            return 0, self.reason
        plan: list[list[Any]] = []
        for entry in sorted(self.root.iterdir(), key=lambda p: p.name):
            if not entry.name.isdigit():
                continue
            try:
                text = (entry / "smp_affinity_list").read_text().strip()
                current = parse_cpulist(text)
            except (OSError, ValueError):
                continue
            if current & cores and (current - cores or cpus - cores):
                plan.append([int(entry.name), text])  # restored as the kernel wrote it
        if not plan:
            return 0, ""
        record("irq", region, irqs=plan)
        moved: list[list[Any]] = []
        refused = 0
        for irq, original in plan:
            rest = (parse_cpulist(original) - cores) or (cpus - cores)
            try:
                _write(self.root / str(irq) / "smp_affinity_list", _cpulist(rest))
                moved.append([irq, original])
            except OSError:
                refused += 1  # some interrupts (per-CPU, managed) cannot move: the kernel says EIO
        self._moved[region] = moved
        return len(moved), f"{refused} IRQs refused to move" if refused else ""

    def give_back(self, region: str) -> int:
        return restore_irqs(self._moved.pop(region, []), self.root)


def restore_irqs(records: Iterable[list[Any]], root: Path = _IRQ_ROOT) -> int:
    n = 0
    for irq, original in records:
        try:
            _write(root / str(int(irq)) / "smp_affinity_list", str(original))
            n += 1
        except (OSError, ValueError):
            continue
    return n


class Shield:
    """The node-wide half of isolation, chosen once (see the module docstring)."""

    def __init__(self, mode: str = "auto", cpus: Iterable[int] | None = None, irqs: bool = False) -> None:
        if mode not in MODES:
            raise ValueError(f"shield must be one of {', '.join(MODES)}, not {mode!r}")
        self.cpus = set(cpus) if cpus is not None else set(os.sched_getaffinity(0))
        self.partition = CpusetPartition() if mode in ("auto", "cpuset") else None
        self.irqs: IrqShield | None = IrqShield() if irqs else None
        #: the mode asked for (``auto`` before it was resolved)
        self.asked = mode
        if mode == "auto":
            mode = "cpuset" if self.partition is not None and self.partition.available else "affinity"
        self.mode = mode
        #: why no cpuset partition can be had (``cpuset`` or ``auto`` asked, partitions unavailable)
        self.reason = ""
        if self.partition is not None and not self.partition.available:
            self.reason = self.partition.reason

    def describe(self) -> str:
        """The mode and, where it is not the one asked for, why (``krex status``)."""
        if self.mode == "cpuset" and self.reason:
            return f"affinity (cpuset partitions unavailable: {self.reason})"
        if self.asked == "auto":
            return f"{self.mode} (auto: {self.reason or 'cpuset partitions available'})"
        return self.mode

    def take(self, region: str, cores: set[int], holder: list[int], record: RecordFn) -> ShieldResult:
        """Partition (cpuset mode) and IRQs. ``result.mode`` says what the core book must still
        move by affinity: "affinity" (every process) or "sessions" (KREX sessions only)."""
        result = ShieldResult(mode="affinity" if self.mode == "cpuset" else self.mode)
        if self.mode == "cpuset":
            if self.partition is None or not self.partition.available:
                result.notes.append(f"cpuset partitions unavailable ({self.reason}): affinities instead")
            else:
                why = self.partition.take(region, cores, holder, record)
                if why:
                    result.notes.append(f"{why}: affinities instead")
                else:
                    result.mode = "cpuset"
                    result.partition = str(self.partition.root / f"{PREFIX}{region}") if self.partition.root else ""
        if self.mode != "sessions" and self.irqs is not None:
            moved, note = self.irqs.take(region, cores, self.cpus, record)
            result.irqs_moved = moved
            if note:
                result.notes.append(f"IRQs: {note}")
        return result

    def give_back(self, region: str) -> list[str]:
        errors = self.partition.give_back(region) if self.partition is not None else []
        if self.irqs is not None:
            self.irqs.give_back(region)
        return errors
