"""The candidate's processes as the judge sees them from outside: a cgroup of their own, the CPU
time they used (every thread and child, exited ones included), and a freeze.

The candidate's process is moved into a cgroup of its own before any candidate code is loaded
(:func:`place`); whatever it starts is born there. The kernel accounts every task's CPU time to
its cgroup as it runs, so a thread that exits, a child process or a finalizer cannot take its
work out of the figure, and no clock of the candidate's own is read.

* cgroup v2 (a pure v2 host, or the ``unified`` hierarchy of a hybrid one): ``cpu.stat``'s
  ``usage_usec`` (present whether or not the cpu controller is enabled) and ``cgroup.freeze``;
* cgroup v1 ``cpuacct`` (a v1-only host): ``cpuacct.usage``, and SIGSTOP to freeze;
* neither (no permission to make a cgroup: not root and nothing delegated): the processes' own
  and reaped children's CPU time from ``/proc`` (threads that exited are in their process's
  figure; a child reaped by someone else, or one that left the candidate's tree, is not), and
  SIGSTOP. :attr:`CandidateGroup.accounting` says which was used.

The group is made as a child of the process's current cgroup, so that a freeze of an enclosing
cgroup (the arbiter's, for a region elsewhere) still reaches the candidate.

Its tasks (processes and threads) are capped at :data:`TASKS_MAX` by the ``pids`` controller:
the v2 group's own where the controller reaches it (enabled in the parent where that is allowed),
else a group of its own in the v1 ``pids`` hierarchy. A fork bomb stops there instead of taking
the node's process table; :attr:`CandidateGroup.tasks` says which cap held, or why none did.
The host memory it adds is capped the same way by the ``memory`` controller, shared memory
included, which the candidate's RLIMIT_DATA does not count (:attr:`CandidateGroup.memory`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from ...procutil import GONE, STOPPED, proc_state, tree

__all__ = ["CandidateGroup", "place", "proc_cpu_reading", "proc_cpu_since"]

PREFIX = "krex-cand-"
_TICK = os.sysconf("SC_CLK_TCK")
#: tasks a candidate may have at once: a compiler's parallel jobs and a framework's thread pool
#: (a thread a core) fit well under it
TASKS_MAX = max(1024, 16 * (os.cpu_count() or 1))


@functools.cache
def _mounts() -> tuple[Path | None, Path | None]:
    """(the cgroup v2 mount, the v1 cpuacct mount), None where there is none."""
    return _v2_mount(), _v1_mount("cpuacct")


@functools.cache
def _v2_mount() -> Path | None:
    found: Path | None = None
    for where, kind, _ in _cgroup_mounts():
        if kind == "cgroup2" and (found is None or len(where.parts) < len(found.parts)):
            found = where
    return found


@functools.cache
def _v1_mount(controller: str) -> Path | None:
    """The v1 hierarchy that holds ``controller``."""
    return next((where for where, kind, opts in _cgroup_mounts() if kind == "cgroup" and controller in opts), None)


def _cgroup_mounts() -> list[tuple[Path, str, list[str]]]:
    out = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
                    out.append((Path(parts[1]), parts[2], parts[3].split(",")))
    except OSError:
        pass
    return out


def _cgroup_line(pid: int, v2: bool, controller: str = "cpuacct") -> str | None:
    """The process's cgroup in the v2 hierarchy (``v2``) or the v1 one holding ``controller``."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if v2 and hier == "0" and controllers == "":
            return path
        if not v2 and controller in controllers.split(","):
            return path
    return None


def proc_cpu_reading(pids: list[int]) -> dict[tuple[int, int], float]:
    """CPU seconds of each of ``pids`` (keyed by pid and start time: pid reuse cannot fake one)
    from /proc: the larger of its stat figure (every thread, exited ones included, and its reaped
    children; kept in clock ticks) and the sum of its live threads' ``schedstat`` (nanoseconds)."""
    out: dict[tuple[int, int], float] = {}
    for pid in pids:
        ticks, start = 0.0, None
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
            ticks = sum(int(x) for x in fields[11:15]) / _TICK
            start = int(fields[19])
        if start is None:
            continue  # gone
        fine = 0
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with (
                    contextlib.suppress(OSError, ValueError, IndexError),
                    open(f"/proc/{pid}/task/{tid}/schedstat") as f,
                ):
                    fine += int(f.read().split()[0])
        out[(pid, start)] = max(ticks, fine / 1e9)
    return out


def proc_cpu_since(before: dict[tuple[int, int], float], after: dict[tuple[int, int], float]) -> float:
    """CPU seconds used between two :func:`proc_cpu_reading`: each process's own difference, one
    started since counted whole, one gone since counted as nothing (not as minus its past)."""
    return sum(max(0.0, v - before.get(k, 0.0)) for k, v in after.items())


class CandidateGroup:
    """One candidate's processes: ``pid`` and everything it started (see the module's docstring).

    ``known`` lists the processes the judge knows as the candidate's besides the cgroup's (its
    tree, daemons re-parented to the worker); the group adds those the cgroup holds."""

    def __init__(self, pid: int, known: Callable[[], list[int]], path: Path | None, kind: str, why: str = "") -> None:
        self.pid = pid
        self.known = known
        #: the cgroup's directory (None: no cgroup, /proc accounting)
        self.path = path
        #: "v2", "v1" or "proc"
        self.kind = kind
        #: why no cgroup could be made (empty where one was)
        self.why = why
        self._stopped: list[int] = []
        self._frozen = False
        #: how many tasks it may have, and by what; or why they are not capped
        self.tasks = "not capped"
        #: how much host memory it may add, and by what; or why it is not capped
        self.memory = "not capped"
        #: its groups in other v1 hierarchies (pids, memory) where its own cgroup lacks the controller
        self.extra_paths: list[Path] = []

    @property
    def accounting(self) -> str:
        """Which accounting the CPU figures come from, in words (for the verdict's metadata)."""
        if self.kind == "v2":
            return f"cgroup v2 cpu.stat of the candidate's own cgroup ({self.path})"
        if self.kind == "v1":
            return f"cgroup v1 cpuacct.usage of the candidate's own cgroup ({self.path})"
        return (
            "/proc: the candidate's processes' own and reaped children's CPU time (no cgroup could be made: "
            f"{self.why}); a child reaped elsewhere is not counted"
        )

    def cgroup_pids(self) -> list[int]:
        if self.path is None:
            return []
        try:
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def pids(self) -> list[int]:
        """Every live process of the candidate's: the cgroup's and the ones the judge knows."""
        seen: dict[int, None] = dict.fromkeys(self.cgroup_pids())
        for pid in [*tree(self.pid), *self.known()]:
            seen.setdefault(pid, None)
        return [p for p in seen if proc_state(p) not in (None, *GONE)]

    def holds(self, pid: int) -> bool:
        """Whether ``pid`` is in this group's cgroup (with no cgroup: whether it is alive)."""
        if self.path is None:
            return proc_state(pid) is not None
        line = _cgroup_line(pid, self.kind == "v2")
        root = _mounts()[0 if self.kind == "v2" else 1]
        return line is not None and root is not None and root / line.lstrip("/") == self.path

    def cgroup_cpu_seconds(self) -> float | None:
        """CPU seconds the candidate's cgroup has used since it was made (None: no cgroup, or it
        could not be read). Only differences of two readings mean anything."""
        try:
            if self.kind == "v2":
                for line in (self.path / "cpu.stat").read_text().splitlines():  # type: ignore[operator]
                    if line.startswith("usage_usec "):
                        return int(line.split()[1]) / 1e6
            elif self.kind == "v1":
                return int((self.path / "cpuacct.usage").read_text()) / 1e9  # type: ignore[operator]
        except (OSError, ValueError):
            pass
        return None

    def cpu_seconds(self) -> float:
        """CPU seconds of the candidate's processes: its cgroup's since it was made, or (without
        one) its live processes' so far. Only differences of two readings mean anything."""
        used = self.cgroup_cpu_seconds()
        return sum(proc_cpu_reading(self.pids()).values()) if used is None else used

    # -- freeze ------------------------------------------------------------------------------------

    def freeze(self, timeout: float = 2.0) -> None:
        """No process of the candidate's runs until :meth:`thaw`: the cgroup frozen (v2) and every
        process of its outside the cgroup (or all of them, without a v2 cgroup) stopped."""
        deadline = time.monotonic() + timeout
        if self.kind == "v2" and self.path is not None:
            with contextlib.suppress(OSError):
                (self.path / "cgroup.freeze").write_text("1")
                self._frozen = True
                while time.monotonic() < deadline:
                    if "frozen 1" in (self.path / "cgroup.events").read_text().splitlines():
                        break
                    time.sleep(0.0002)
        # processes outside the cgroup (a shield partition took them, or there is none): stopped,
        # as often as new ones appear (one may fork while the list is read)
        inside = set(self.cgroup_pids()) if self._frozen else set()
        for _ in range(8):
            fresh = [p for p in self.pids() if p not in inside and p not in self._stopped]
            if not fresh:
                break
            for pid in fresh:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGSTOP)
                    self._stopped.append(pid)
        for pid in self._stopped:  # SIGSTOP lands asynchronously: wait until each one is stopped
            while time.monotonic() < deadline and proc_state(pid) not in (None, *GONE, *STOPPED):
                time.sleep(0.0002)

    def thaw(self) -> None:
        """Undo :meth:`freeze` (every process it stopped continued; never left stopped)."""
        for pid in self._stopped:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        self._stopped = []
        if self._frozen and self.path is not None:
            with contextlib.suppress(OSError):
                (self.path / "cgroup.freeze").write_text("0")
            self._frozen = False

    def remove(self) -> None:
        """The cgroups removed once their processes are gone (killed first if any is left)."""
        self.thaw()
        for path in (self.path, *self.extra_paths):
            if path is not None:
                _remove(path, self.kind == "v2" and path == self.path)
        self.extra_paths = []


def _remove(path: Path, v2: bool) -> None:
    for i in range(200):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            pass
        if i == 0 and v2:
            with contextlib.suppress(OSError):
                (path / "cgroup.kill").write_text("1")
        with contextlib.suppress(OSError, ValueError):
            for pid in [int(x) for x in (path / "cgroup.procs").read_text().split()]:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


def _sweep(parent: Path) -> None:
    """Groups left by judges that died (their pid is in the name) removed where empty."""
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            name = entry.name
            if not name.startswith(PREFIX):
                continue
            judge = name[len(PREFIX) :].split("-")[0]
            if judge.isdigit() and proc_state(int(judge)) in (None, *GONE):
                with contextlib.suppress(OSError):
                    entry.rmdir()


def _make(pid: int, kind: str) -> Path:
    v2, v1 = _mounts()
    root = v2 if kind == "v2" else v1
    if root is None:
        raise OSError(f"no cgroup {kind} hierarchy is mounted")
    line = _cgroup_line(pid, kind == "v2")
    if line is None:
        raise OSError(f"the process is in no cgroup {kind}")
    parent = root / line.lstrip("/")
    _sweep(parent)
    path = parent / f"{PREFIX}{os.getpid()}-{pid}"
    path.mkdir()
    try:
        (path / "cgroup.procs").write_text(str(pid))
        if kind == "v2" and not (path / "cpu.stat").exists():
            raise OSError("cpu.stat is missing in the new cgroup")
        if kind == "v1" and not (path / "cpuacct.usage").exists():
            raise OSError("cpuacct.usage is missing in the new cgroup")
    except BaseException:
        with contextlib.suppress(OSError):
            (parent / "cgroup.procs").write_text(str(pid))
        with contextlib.suppress(OSError):
            path.rmdir()
        raise
    return path


def place(
    pid: int, known: Callable[[], list[int]], kinds: tuple[str, ...] = ("v2", "v1"), memory_limit: int = 0
) -> CandidateGroup:
    """``pid`` (a candidate's process, before its code loads) in a cgroup of its own: v2 first,
    then v1 cpuacct; a group without a cgroup (/proc accounting) where neither can be made. Its
    tasks capped where a pids controller allows (:attr:`CandidateGroup.tasks`), and the host
    memory it adds at ``memory_limit`` bytes where a memory controller does (:attr:`~CandidateGroup.memory`)."""
    why: list[str] = []
    group: CandidateGroup | None = None
    for kind in kinds:
        try:
            group = CandidateGroup(pid, known, _make(pid, kind), kind)
            break
        except OSError as exc:
            why.append(f"{kind}: {exc.strerror or exc}")
    if group is None:
        group = CandidateGroup(pid, known, None, "proc", "; ".join(why) or "no cgroup asked for")
    _cap_tasks(group)
    _cap_memory(group, memory_limit)
    return group


def _cap(group: CandidateGroup, controller: str, v2: dict[str, str], v1: dict[str, str]) -> str:
    """Limits (a control file of ``controller`` -> its value; the first is required, the others
    set where the kernel has them) written for the group: in its own cgroup where that one has the
    controller (a v2 group's parent enables it where allowed), else in a group of the v1 hierarchy
    that holds it. Where it held, in words ("its cgroup v2", ...), or "not capped (why)"."""
    why: list[str] = []
    limits = v2 if group.kind == "v2" else v1
    first, *rest = limits
    if group.path is not None:
        try:
            if group.kind == "v2" and not (group.path / first).exists():
                parent = group.path.parent
                if controller not in (parent / "cgroup.controllers").read_text().split():
                    raise OSError(errno.ENOENT, f"the {controller} controller does not reach it")
                (parent / "cgroup.subtree_control").write_text(f"+{controller}")
            _write_limits(group.path, first, rest, limits)
            return f"its cgroup {group.kind}"
        except OSError as exc:
            why.append(f"{group.kind}: {exc.strerror or exc}")
    root = _v1_mount(controller)
    line = _cgroup_line(group.pid, False, controller)
    if root is None or line is None:
        why.append(f"no v1 {controller} hierarchy")
        return "not capped (" + "; ".join(why) + ")"
    parent = root / line.lstrip("/")
    _sweep(parent)
    path = parent / f"{PREFIX}{os.getpid()}-{group.pid}"
    first, *rest = limits = v1
    try:
        path.mkdir()
        _write_limits(path, first, rest, limits)
        (path / "cgroup.procs").write_text(str(group.pid))
    except OSError as exc:
        with contextlib.suppress(OSError):
            path.rmdir()
        why.append(f"v1 {controller}: {exc.strerror or exc}")
        return "not capped (" + "; ".join(why) + ")"
    group.extra_paths.append(path)
    return f"its cgroup in the v1 {controller} hierarchy"


def _write_limits(path: Path, first: str, rest: list[str], limits: dict[str, str]) -> None:
    (path / first).write_text(limits[first])
    for name in rest:
        if (path / name).exists():
            (path / name).write_text(limits[name])


def _cap_tasks(group: CandidateGroup) -> None:
    """The group's tasks capped at :data:`TASKS_MAX` (a fork bomb stops there)."""
    limit = {"pids.max": str(TASKS_MAX)}
    where = _cap(group, "pids", limit, limit)
    group.tasks = where if where.startswith("not capped") else f"at most {TASKS_MAX} (pids.max of {where})"


#: what the kernel charges a candidate's cgroup beyond the allocations its RLIMIT_DATA counts
#: (pages of its parent's it copies as it writes them, files it reads in): the cgroup's cap is
#: this much above the allowance, so that an allocation past the allowance is the process's
#: MemoryError, and the cgroup stops only what the rlimit does not see
MEMORY_MARGIN = 256 << 20


def _cap_memory(group: CandidateGroup, allowance: int) -> None:
    """The host memory the group's processes add from now on capped a margin above
    ``allowance`` bytes, shared memory included (a memfd, a MAP_SHARED mapping: RLIMIT_DATA
    counts neither), with no swap beyond it. What it charged before it was placed (its CUDA
    context) stays where it was."""
    if allowance <= 0:
        group.memory = "not capped (no limit asked for)"
        return
    limit = allowance + max(MEMORY_MARGIN, allowance // 8)
    v2 = {"memory.max": str(limit), "memory.swap.max": "0"}
    v1 = {"memory.limit_in_bytes": str(limit), "memory.memsw.limit_in_bytes": str(limit)}
    where = _cap(group, "memory", v2, v1)
    mib = limit >> 20
    group.memory = where if where.startswith("not capped") else f"at most {mib} MiB added ({where})"
