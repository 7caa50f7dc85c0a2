"""Sessions in cgroups that the arbiter manages, so that a freeze catches every fork.

cgroup v2's ``cgroup.freeze`` stops every process of a cgroup, and everything forked there
afterwards, in the kernel; no tree walk can race it. The arbiter (``--cgroups auto``) moves
each session's process into ``<v2 root>/krex/<session>`` when it registers; children it
starts later are born inside. Children it had before stay outside and are stopped with
SIGSTOP as usual. Opt-in: moving processes between cgroups can fight a host's own cgroup
management (systemd units, Kubernetes pods), so SIGSTOP is the default.

Works on a pure v2 hierarchy (``/sys/fs/cgroup``) and on the hybrid layout, whose v2
hierarchy (``/sys/fs/cgroup/unified``) freezes without any controller.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from pathlib import Path

from ..paths import UnsafePath
from ..procfiles import read_proc

log = logging.getLogger("krex.cgroups")


@functools.cache
def v2_root() -> Path | None:
    """Mount point of the cgroup v2 hierarchy, if there is one (read once: every region's freeze
    and thaw asks, and a node does not move its hierarchy under a running arbiter)."""
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    found = [Path(m[1]) for m in mounts if len(m) > 2 and m[2] == "cgroup2"]
    return min(found, key=lambda p: len(p.parts)) if found else None


def krex_cgroup_fd(path: str) -> int:
    """A directory fd on ``path`` if it is a cgroup KREX manages:
    ``<cgroup v2 root>/krex/<name>``, opened component by component without following links.
    Raises :class:`UnsafePath` for any other path (a crafted journal could name any file)."""
    root = v2_root()
    if root is None:
        raise UnsafePath(f"{path}: no cgroup v2 hierarchy is mounted")
    p = Path(path)
    try:
        rel = p.relative_to(root)
    except ValueError:
        raise UnsafePath(f"{path} is not under the cgroup v2 hierarchy {root}") from None
    parts = rel.parts
    if len(parts) != 2 or parts[0] != "krex" or parts[1] in ("", ".", "..") or os.path.normpath(path) != path:
        raise UnsafePath(f"{path} is not a cgroup KREX manages ({root}/krex/<session>)")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def cgroup_of(pid: int) -> str | None:
    """The process's v2 cgroup, relative to the hierarchy's root (``/krex/s1-…``)."""
    for line in (read_proc(f"/proc/{pid}/cgroup", whole=True) or b"").decode(errors="replace").splitlines():
        if line.startswith("0::"):
            return line[3:].strip()
    return None


def is_frozen(path: str | Path) -> bool:
    """Whether every process of the cgroup at ``path`` is frozen (read afresh; the region sequence
    reads through :data:`FREEZE_FILES`)."""
    try:
        return "frozen 1" in Path(path, "cgroup.events").read_text()
    except OSError:
        return False


#: v2 interface files whose value, when not the default, limits the processes of a cgroup
LIMIT_FILES = {
    "memory.max": "max",
    "memory.high": "max",
    "memory.swap.max": "max",
    "pids.max": "max",
    "cpu.max": "max",
    "io.max": "",
    "cpuset.cpus": "",
    "cpuset.mems": "",
    "hugetlb.2MB.max": "max",
}


def limits_on(root: Path, cgroup: str) -> dict[str, str]:
    """The limits that apply to a process of ``cgroup`` (relative to the v2 ``root``), from the
    cgroup up to (not including) the root: ``{"/a/b/memory.max": "1073741824", ...}``."""
    found: dict[str, str] = {}
    parts = [p for p in cgroup.strip("/").split("/") if p]
    while parts:
        here = root.joinpath(*parts)
        for name, default in LIMIT_FILES.items():
            try:
                value = (here / name).read_text().strip()
            except OSError:
                continue
            if value != default and not (name == "cpu.max" and value.startswith("max")):
                found["/" + "/".join(parts) + "/" + name] = value
        parts.pop()
    return found


class CgroupPlacer:
    """Creates ``<root>/krex/<session>`` and moves a session's process into it."""

    def __init__(self, enabled: bool, name: str = "krex") -> None:
        self.base: Path | None = None
        self.root: Path | None = None
        self.reason = "disabled by --cgroups off"
        #: where a process is now (tests point it elsewhere: this machine's may be the root)
        self.cgroup_of = cgroup_of
        if not enabled:
            return
        root = v2_root()
        if root is None:
            self.reason = "no cgroup v2 hierarchy is mounted"
            return
        base = root / name
        try:
            base.mkdir(exist_ok=True)
            if not (base / "cgroup.freeze").exists():
                raise OSError("no cgroup.freeze (kernel older than 5.2)")
            probe = base / ".probe"
            probe.mkdir(exist_ok=True)
            probe.rmdir()
        except OSError as exc:
            self.reason = f"cannot manage cgroups under {root}: {exc}"
            return
        self.root, self.base, self.reason = root, base, f"sessions placed under {base}"
        self.sweep()

    @property
    def enabled(self) -> bool:
        return self.base is not None

    def place(self, session: str, pid: int) -> str:
        """Move ``pid`` into the session's cgroup; returns its path, or "" where that failed or
        would lift limits: a process whose cgroup (or one above it) limits memory, CPU, pids, I/O
        or cpusets stays where it is (SIGSTOP freezes it), since ``krex/`` has none of them."""
        if self.base is None or self.root is None:
            return ""
        current = self.cgroup_of(pid)
        limits = limits_on(self.root, current) if current else {}
        if limits:
            log.info(
                "session %s stays in its cgroup %s, whose limits would not apply under %s (%s): SIGSTOP will freeze it",
                session,
                current,
                self.base,
                ", ".join(f"{k}={v}" for k, v in limits.items()),
            )
            return ""
        path = self.base / session
        try:
            path.mkdir(exist_ok=True)
            (path / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            log.info("session %s stays in its cgroup (%s): SIGSTOP will freeze it", session, exc)
            with contextlib.suppress(OSError):
                path.rmdir()
            return ""
        return str(path)

    def relative(self, path: str) -> str:
        """``path`` as /proc/PID/cgroup names it."""
        assert self.root is not None
        root = str(self.root).rstrip("/")
        if not path.startswith(root + "/"):
            raise ValueError(f"{path} is not under {root}")
        return path[len(root) :]

    def remove(self, path: str) -> None:
        """Drop a session's cgroup once it is empty (a live child keeps it until the next sweep).

        Never thaws: a region may hold it frozen; the region's release (or the journal) thaws.
        """
        if path:
            with contextlib.suppress(OSError):
                os.rmdir(path)

    def sweep(self) -> None:
        """Remove empty cgroups left by sessions of an earlier arbiter (its journal has been
        replayed by then, so nothing of it is still frozen)."""
        if self.base is None:
            return
        for child in self.base.iterdir():
            if child.is_dir():
                self.remove(str(child))
