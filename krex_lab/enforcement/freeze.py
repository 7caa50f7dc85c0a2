"""Step 4 of a region: freeze sibling sessions, whole process trees, compiler children included.

Two mechanisms:

* **cgroup v2** (``cgroup.freeze``) for sessions the arbiter placed in a cgroup it manages
  (:mod:`krex_lab.enforcement.cgroups`); the kernel catches forks for us. Processes of such a
  tree that live outside the cgroup (children from before the session was placed) still get
  SIGSTOP.
* **SIGSTOP** otherwise. A process may fork while its tree is being stopped, so the tree is
  walked again after every pass until a pass finds no new process. The kernel aborts a
  fork() that a signal interrupts, so once SIGSTOP is queued a process makes no new child;
  a child it made just before shows up in the next walk. Signals land asynchronously, so
  :meth:`Freezer.settle` (run right after the grant, off the critical path) waits for every
  stop to show and walks the trees once more. Processes that were already stopped (a user's
  Ctrl-Z, a debugger) are left alone and, above all, not resumed at thaw.

  A parent that waits with ``WUNTRACED`` stops *itself* when it sees its child stop: ``runuser``,
  ``su`` and ``sudo`` do (they were left in state T, their command never returning). So the
  ancestors of every stopped session root that were running when the region froze it are kept
  (:attr:`FreezeResult.kin`), and the thaw continues those found stopped (:func:`continue_kin`;
  the scheduler looks again shortly after, for a parent whose own stop lands late). A job-control
  shell does not stop, but takes its terminal back: the thawed job runs on in the background.
  The cgroup freezer sends no stop and no parent notices anything: prefer it (``--cgroups auto``).

Every pid is journaled (with its start time) before it is signalled.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..paths import UnsafePath
from ..procutil import (
    STOPPED,
    open_stat,
    parent_state_start,
    proc_state,
    read_stat,
    read_state,
    same_process,
    session_tree,
    state_and_start,
    state_and_threads,
)
from .cgroups import cgroup_of, krex_cgroup_fd

log = logging.getLogger("krex.freeze")

Record = Callable[..., None]  # Journal.record(kind, region, **data)

_MAX_PASSES = 50
#: session roots whose parents a freezer keeps (forgotten all at once past this)
_PARENTS_KEPT = 1 << 14


@dataclass
class FreezeResult:
    procs: list[tuple[int, int]] = field(default_factory=list)  # (pid, start) we stopped
    cgroups: list[str] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # already stopped by someone else
    failed: list[str] = field(default_factory=list)
    inside: set[str] = field(default_factory=set)  # frozen cgroups, as /proc/PID/cgroup names them
    roots: set[int] = field(default_factory=set)  # session roots already walked
    #: a pidfd per stopped process: the thaw signals through it (a reused pid cannot be hit, and
    #: no /proc read is needed to make sure); closed by :func:`thaw`
    pidfds: dict[int, int] = field(default_factory=dict)
    #: a stat descriptor per process whose stop may not have landed yet: :meth:`Freezer.pending`
    #: re-reads it without a path lookup; closed once the stops have landed (:meth:`landed`).
    #: Session roots have none: their stat files are kept across regions (procfiles.KEPT)
    statfds: dict[int, int] = field(default_factory=dict)

    #: how many of :attr:`procs` and :attr:`cgroups` are known to have landed (a stop that has
    #: landed stays landed while the region holds): :meth:`Freezer.pending` looks past them only
    landed_procs: int = 0
    landed_cgroups: int = 0
    #: thread counts of session roots seen stopped (:meth:`Freezer.pending`): the settle's walk
    #: of a stopped root of one thread reads its children file alone
    threads: dict[int, int] = field(default_factory=dict)
    #: session roots seen in the cgroup frozen for their session (not read again in the walks)
    placed: set[int] = field(default_factory=set)
    #: the members of each frozen cgroup as read when it was frozen (a frozen cgroup gains none)
    members: dict[str, list[int]] = field(default_factory=dict)
    #: ancestors of the stopped session roots that were not stopped when the region froze them:
    #: pid -> start time (see :func:`continue_kin`)
    kin: dict[int, int] = field(default_factory=dict)
    #: every ancestor looked at for :attr:`kin` (stopped ones too), with its parent and start
    #: time: a walk ends at one of them
    kin_looked: dict[int, tuple[int, int | None]] = field(default_factory=dict)
    #: the frozen roots' own parents (where :func:`continue_kin` starts to climb)
    kin_first: set[int] = field(default_factory=set)

    def seen_landed(self, procs: int, cgroups: int) -> None:
        """The first ``procs`` stops and ``cgroups`` cgroup freezes were seen to land (counted
        before the grant's first look: a stop made at a drain's answer during the wait is not)."""
        self.landed_procs, self.landed_cgroups = procs, cgroups

    def landed(self) -> None:
        """Every stop has shown: the stat descriptors are not needed any more."""
        for fd in self.statfds.values():
            os.close(fd)
        self.statfds.clear()

    @property
    def pids(self) -> list[int]:
        """Processes stopped with SIGSTOP."""
        return [p for p, _ in self.procs]

    def all_pids(self) -> list[int]:
        """Every frozen process: stopped ones and the members of frozen cgroups (as read when each
        was frozen: the grant's report and the release's read nothing more)."""
        for path in self.cgroups:
            if path not in self.members:
                self.members[path] = FREEZE_FILES.members(path)
        return sorted(set(self.pids).union(*self.members.values()))


class FreezeFiles:
    """Kept descriptors of the ``cgroup.freeze``, ``cgroup.events`` and ``cgroup.procs`` files of
    the cgroups KREX manages: a region writes and reads them for every sibling session, and a
    path opened component by component (:func:`krex_lab.enforcement.cgroups.krex_cgroup_fd`) costs eight
    syscalls. Each is opened that safe way once and kept until its session ends
    (:meth:`forget`). Any other path is refused as it is by that function."""

    def __init__(self) -> None:
        self._files: dict[str, tuple[int, ...]] = {}  # path -> (freeze, events, procs) descriptors
        self._lock = threading.Lock()  # the event loop and the guardian's undo may both write

    def _get(self, path: str, open_new: bool = True) -> tuple[int, ...]:
        files = self._files.get(path)
        if files is None and not open_new:
            raise LookupError(path)
        if files is None:
            dirfd = krex_cgroup_fd(path)
            opened: list[int] = []
            try:
                for name, mode in (
                    ("cgroup.freeze", os.O_WRONLY),
                    ("cgroup.events", os.O_RDONLY),
                    ("cgroup.procs", os.O_RDONLY),
                ):
                    opened.append(os.open(name, mode | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd))
            except OSError:
                for fd in opened:
                    os.close(fd)
                raise
            finally:
                os.close(dirfd)
            files = self._files[path] = tuple(opened)
        return files

    def set(self, path: str, frozen: bool) -> None:
        """Freeze or thaw ``path`` (raises OSError, or UnsafePath for a path KREX does not manage;
        a thaw raises LookupError where the files are not kept: its session has ended, and the
        caller thaws the careful way without keeping anything)."""
        with self._lock:
            os.write(self._get(path, open_new=frozen)[0], b"1" if frozen else b"0")

    def frozen(self, path: str) -> bool:
        """Whether every process of ``path`` is frozen now (False where it cannot be read)."""
        with self._lock:
            try:
                return b"frozen 1" in os.pread(self._get(path)[1], 4096, 0)
            except Exception:
                return False

    def members(self, path: str) -> list[int]:
        """The processes in ``path`` now (empty where it cannot be read)."""
        with self._lock:
            try:
                fd = self._get(path)[2]
                chunks = [os.pread(fd, 65536, 0)]
                while len(chunks[-1]) == 65536:  # thousands of members: read on
                    chunks.append(os.pread(fd, 65536, 65536 * len(chunks)))
            except Exception:
                return []
        return [int(x) for x in b"".join(chunks).split()]

    def forget(self, path: str) -> None:
        """Close ``path``'s files (its session ended; the cgroup is about to go)."""
        with self._lock:
            for fd in self._files.pop(path, ()):
                os.close(fd)


#: the region sequence's kept cgroup files (one arbiter per process)
FREEZE_FILES = FreezeFiles()


class Freezer:
    """Stops process trees; the journal callback runs before any signal is sent.

    ``cgroup_of_session(pid)`` names the cgroup the arbiter placed a session root in (""
    for none); ``relative`` turns such a path into the name /proc/PID/cgroup uses.
    """

    def __init__(
        self,
        record: Record,
        cgroup_of_session: Callable[[int], str] | None = None,
        relative: Callable[[str], str] | None = None,
        journal_kin: bool = False,
    ) -> None:
        self._record = record
        #: journal the ancestors a freeze may make stop themselves before it stops anyone
        self.journal_kin = journal_kin
        #: session root -> (its start time, its parent, the parent's start time)
        self._parents: dict[int, tuple[int, int, int | None]] = {}
        self._cgroup_of_session = cgroup_of_session or (lambda pid: "")
        self._relative = relative or (lambda path: path)

    def _note_kin(self, root: int, root_start: int | None, result: FreezeResult) -> None:
        """Keep the running ancestors of ``root`` (``root_start``: its start time as the walk just
        read it), walking up until one already looked at in this region, or init. Worked out once
        per frozen tree: sibling sessions share their ancestors, so the walk of each after the
        first ends at its parent, and a root's parent is kept from its first region (checked by
        the root's and the parent's start times). Reading every root's whole chain each region
        cost half the arbiter's time at 8 GPUs x 64 sessions (scale.py)."""
        kept = self._parents.get(root)
        parent, start, new = 0, None, False
        if kept is not None and root_start is not None and kept[0] == root_start and kept[1] > 1:
            up, start, new = _look_kin(kept[1], result)
            if start is not None and start == kept[2]:
                parent = kept[1]
            elif new:  # another process under a reused pid: nobody's parent here
                result.kin.pop(kept[1], None)
        if not parent:  # a new root, or its parent ended (it was reparented)
            parent, _, own_start = parent_state_start(root, kept=True)
            if own_start is None or parent <= 1:
                return
            up, start, new = _look_kin(parent, result)
            if len(self._parents) > _PARENTS_KEPT:
                self._parents.clear()
            self._parents[root] = (own_start, parent, start)
        result.kin_first.add(parent)
        # Above a parent looked at earlier in this region (by a sibling), the chain was walked then.
        while new and start is not None and up > 1:
            up, start, new = _look_kin(up, result)

    def freeze(
        self, region: str, roots: Iterable[int], exempt: set[int], result: FreezeResult | None = None
    ) -> FreezeResult:
        result = result if result is not None else FreezeResult()
        # One walk on the critical path (trees stopped already, on drain ack, are not walked
        # again here); settle() walks everything again once the stops have landed.
        done = set(result.pids) | set(result.roots)
        self.extend(region, result, [r for r in roots if r not in done], exempt, passes=1)
        return result

    def _freeze_cgroups(self, region: str, result: FreezeResult, roots: list[int]) -> None:
        groups = [(r, g) for r, g in ((r, self._cgroup_of_session(r)) for r in roots) if g and g not in result.cgroups]
        if not groups:
            return
        self._record("cgfreeze", region, paths=[g for _, g in groups])
        for root, path in groups:
            try:
                FREEZE_FILES.set(path, True)
                result.cgroups.append(path)
                result.inside.add(self._relative(path))
            except (OSError, ValueError, UnsafePath) as exc:  # ValueError: not under the hierarchy
                result.failed.append(f"cgroup {path}: {exc}")
                continue
            # A process with sessions on two GPUs sits in the cgroup of its last: the root is
            # frozen with this one only if it is in it (one read, kept for the report too).
            members = result.members[path] = FREEZE_FILES.members(path)
            if root in members:
                result.placed.add(root)

    def extend(
        self, region: str, result: FreezeResult, roots: list[int], exempt: set[int], passes: int = _MAX_PASSES
    ) -> None:
        """Stop the trees of ``roots`` into an existing result (used for intruders too)."""
        self._freeze_cgroups(region, result, roots)
        unnoted = {r for r in roots if r not in result.roots and r not in result.placed}
        result.roots.update(roots)
        seen = set(result.pids) | set(result.skipped)
        for _ in range(passes):
            new: list[tuple[int, int, int | None]] = []  # pid, start, stat descriptor
            kin = len(result.kin)
            for root in roots:
                # walked again at settle, and every region
                pids, root_stat = session_tree(root, result.threads.get(root))
                if root in unnoted:  # before any stop of its tree is sent
                    unnoted.discard(root)
                    self._note_kin(root, root_stat[1] if root_stat else None, result)
                for pid in pids:
                    if pid in seen or pid in exempt:
                        continue
                    seen.add(pid)
                    if pid in result.placed or (result.inside and cgroup_of(pid) in result.inside):
                        continue  # the kernel freezes it with its cgroup, forks included
                    fd: int | None = None
                    state: str | None
                    start: int | None
                    if pid == root and root_stat is not None:
                        # read in the walk's look; :meth:`pending` reads a root's kept stat file
                        state, start = root_stat
                    else:
                        fd = open_stat(pid)
                        state, start = read_stat(fd) if fd is not None else state_and_start(pid)
                    if state is None or start is None or state in ("Z", "T", "t"):
                        if state in STOPPED:
                            result.skipped.append(pid)
                        if fd is not None:
                            os.close(fd)
                        continue
                    new.append((pid, start, fd))
            if not new:
                return
            if self.journal_kin and len(result.kin) > kin:
                # Before the stops: a parent that stops itself when they land is continued by
                # whoever undoes this region, the guardian or a restarted arbiter too.
                self._record("kin", region, procs=[[p, t] for p, t in list(result.kin.items())[kin:]])
            self._record("stop", region, procs=[[pid, start] for pid, start, _ in new])
            for pid, start, fd in new:
                try:
                    _stop(pid, result.pidfds)
                    result.procs.append((pid, start))
                    if fd is not None:
                        result.statfds[pid] = fd
                        fd = None
                except ProcessLookupError:
                    continue
                except PermissionError as exc:
                    result.failed.append(f"pid {pid}: {exc.strerror}")
                finally:
                    if fd is not None:
                        os.close(fd)
        if passes == _MAX_PASSES:
            result.failed.append(f"trees kept growing after {_MAX_PASSES} passes")

    @staticmethod
    def pending(result: FreezeResult, among: list[str] | None = None) -> list[str]:
        """What was told to stop and may not have yet (a D-state sleeper can take a while): pids as
        strings, cgroup paths; empty once every stop has landed. ``among``: an earlier answer, to
        check only what was still pending then; without it, what is not known to have landed
        (:meth:`FreezeResult.seen_landed`): a stop that has landed stays landed while the region
        holds. The pids are looked at in the order they were stopped and the look ends
        at the first that has not: the rest are returned unchecked (stops land roughly in the
        order they were sent, so a wait costs one read per poll instead of one per process)."""
        if among is None:
            pids = [p for p, _ in result.procs[result.landed_procs :]]
            groups = result.cgroups[result.landed_cgroups :]
        else:
            pids = [int(x) for x in among if x.isdigit()]
            groups = [x for x in among if not x.isdigit()]
        fds, roots = result.statfds, result.roots
        for i, p in enumerate(pids):
            if p in fds:
                state = read_state(fds[p])
            elif p in roots:
                state, threads = state_and_threads(p)
                if state in STOPPED and threads is not None:
                    result.threads[p] = threads
            else:
                state = proc_state(p)
            if state not in ("T", "t", "Z", None):
                return [str(q) for q in pids[i:]] + list(groups)
        return [c for c in groups if not FREEZE_FILES.frozen(c)]

    def settle(self, region: str, result: FreezeResult, roots: list[int], exempt: set[int]) -> list[int]:
        """Walk the trees again and stop what is new; returns the processes caught late."""
        before = set(result.pids)
        self.extend(region, result, roots, exempt)
        return [p for p in result.pids if p not in before]


def thaw_procs(procs: Iterable[tuple[int, int]]) -> int:
    """SIGCONT every (pid, start) that is still the process we stopped. Returns how many."""
    n = 0
    for pid, start in procs:
        if same_process(pid, start):
            try:
                os.kill(pid, signal.SIGCONT)
                n += 1
            except OSError:
                continue
    return n


def thaw_cgroups(paths: Iterable[str]) -> int:
    """Write 0 to ``cgroup.freeze`` of every cgroup KREX manages among ``paths``. Any other path
    (a journal may be crafted) is refused before anything is written, and the file is opened
    from the cgroup's directory fd without following a link."""
    n = 0
    for path in paths:
        try:
            dirfd = krex_cgroup_fd(path)
        except (OSError, UnsafePath) as exc:
            log.warning("not thawing %r: %s", path, exc)
            continue
        try:
            fd = os.open("cgroup.freeze", os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
            n += 1
        except OSError:
            continue
        finally:
            os.close(dirfd)
    return n


def _stop(pid: int, pidfds: dict[int, int]) -> None:
    """SIGSTOP ``pid``, keeping a pidfd of it for the thaw where the kernel gives one (a node out
    of descriptors still freezes: the thaw then checks the pid's start time instead)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise
    except (OSError, AttributeError):
        os.kill(pid, signal.SIGSTOP)
        return
    try:
        signal.pidfd_send_signal(fd, signal.SIGSTOP)
    except BaseException:
        os.close(fd)
        raise
    pidfds[pid] = fd


def _look_kin(pid: int, result: FreezeResult) -> tuple[int, int | None, bool]:
    """``pid``'s parent and start time, and whether it was looked at just now (not earlier in
    this region); kept in :attr:`FreezeResult.kin` if it runs."""
    seen = result.kin_looked.get(pid)
    if seen is not None:
        return seen[0], seen[1], False
    # Kept descriptors: the same few ancestors are read every region (a path lookup is most of a read).
    parent, state, start = parent_state_start(pid, kept=True)
    result.kin_looked[pid] = (parent, start)
    if state is not None and start is not None and state not in STOPPED:
        result.kin[pid] = start
    return parent, start, True


def continue_kin(
    kin: dict[int, int], first: Iterable[int] | None = None, up: dict[int, tuple[int, int | None]] | None = None
) -> list[int]:
    """SIGCONT the processes of ``kin`` (pid -> start time, running when the region began) that
    are stopped now: a parent that stopped itself because the region stopped its child.

    With ``first`` (the frozen roots' own parents) and ``up`` (each ancestor's parent, as
    :attr:`FreezeResult.kin_looked` keeps them), only chains of stopped parents are climbed: a
    parent stops itself only when its child stops, so above one that is running (no WUNTRACED
    waiter) nothing stopped because of the region, and nothing there is read. Without them,
    every one of ``kin`` is looked at (the journal's undo)."""
    todo = list(kin) if first is None else [p for p in first if p in kin]
    seen: set[int] = set()
    continued = []
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        state, now = state_and_start(pid, kept=True)
        if now != kin.get(pid) or state != "T":
            continue
        try:
            os.kill(pid, signal.SIGCONT)
            continued.append(pid)
        except OSError:
            continue
        parent = up.get(pid) if up is not None and first is not None else None
        if parent is not None and parent[0] in kin:
            todo.append(parent[0])
    if continued:
        log.info("continued %s: stopped when the region stopped a child of theirs", continued)
    return continued


def thaw(result: FreezeResult) -> None:
    result.landed()
    for path in result.cgroups:  # through the kept files; the careful way where that fails
        try:
            FREEZE_FILES.set(path, False)
        except (OSError, UnsafePath, LookupError):
            thaw_cgroups([path])
    by_pid = [(pid, start) for pid, start in result.procs if pid not in result.pidfds]
    for fd in list(result.pidfds.values()):
        try:
            signal.pidfd_send_signal(fd, signal.SIGCONT)
        except OSError:
            pass  # it exited
        finally:
            os.close(fd)
    result.pidfds.clear()
    thaw_procs(by_pid)
    continue_kin(result.kin, result.kin_first, result.kin_looked)
