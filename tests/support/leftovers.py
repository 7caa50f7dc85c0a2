"""The suite leaves the machine as it found it: a pytest plugin (loaded by ``tests/conftest.py``).

- Caches that torch and Ray write by default in /tmp (``/tmp/torchinductor_USER``, ``/tmp/ray``)
  go into the run's own temporary directory, which pytest rotates.
- Every process the run starts carries a mark in its environment; one still alive when the run
  ends (an orphan: its parent gone, it is no test's child any more) is named, killed, and fails the
  run.
- ``git status --porcelain`` of the checkout at the end must be what it was at the start: a file
  written into the checkout (or one deleted) is named and fails the run.
- Ctrl-C reaches what the tests start. A run started in the background by a shell without job
  control (``make test &`` in a script) inherits SIGINT ignored, and an ignored or blocked signal
  is inherited across fork and exec: every ``krex run`` a test starts would ignore Ctrl-C. The run
  (and each xdist worker) puts the default handler back when it starts; a test (or a library it
  runs in the test process) that leaves SIGINT ignored or blocked fails, and the signal is put back.
- The node's core lock file of a user with no ``XDG_RUNTIME_DIR`` (``/tmp/krex-cores-UID.lock``),
  made by the run's arbiters where there was none, is removed at its end unless something holds it.
- The users the root tests make (``useradd``) are gone at its end, and take their files in
  ``/tmp`` and ``/dev/shm`` with them (:func:`remove_files_of`, before ``userdel``): a user left
  in the passwd database, or an entry there that the run made and whose owner no longer exists,
  is named (the entry removed) and fails the run.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

#: the environment variable that marks this run's processes
MARK = "KREX_TEST_RUN"
#: how long processes that were just killed by the last fixtures may take to go
GRACE_S = 5.0

_state: dict[str, object] = {}


def _git_status(root: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _marked(token: str) -> list[psutil.Process]:
    """Processes other than this one and its ancestors whose environment carries ``token``."""
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for proc in psutil.process_iter():
        if proc.pid in mine:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(MARK) == token:
                found.append(proc)
        except psutil.Error:
            continue
    return found


#: where a user's files outlive their processes (a KREX runtime dir without XDG_RUNTIME_DIR, a
#: test's script dir made theirs)
SHARED_TMP = ("/tmp", "/dev/shm")


def _entries() -> set[str]:
    found = set()
    for top in SHARED_TMP:
        with contextlib.suppress(OSError):
            found |= {os.path.join(top, name) for name in os.listdir(top)}
    return found


def files_of(uid: int) -> set[str]:
    """What ``uid`` owns at the top of ``/tmp`` and ``/dev/shm``."""
    found = set()
    for path in _entries():
        with contextlib.suppress(OSError):
            if os.lstat(path).st_uid == uid:
                found.add(path)
    return found


def remove_files_of(uid: int, keep: set[str]) -> None:
    """Remove what ``uid`` owns at the top of ``/tmp`` and ``/dev/shm`` but ``keep`` (what it owned
    when the run made it: a deleted user's files carry its uid, which ``useradd`` gives again):
    called for a user the run made, before ``userdel``."""
    for path in files_of(uid) - keep:
        _remove(path)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _ownerless(since: set[str]) -> list[str]:
    """Entries made since ``since`` whose owner is no user any more (one the run made and deleted)."""
    out = []
    for path in sorted(_entries() - since):
        try:
            pwd.getpwuid(os.lstat(path).st_uid)
        except KeyError:
            out.append(path)
        except OSError:
            continue
    return out


def _describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {' '.join(proc.cmdline())[:120]}"
    except psutil.Error:
        return str(proc.pid)


@pytest.fixture(autouse=True)
def _ctrl_c_reaches_what_tests_start() -> Iterator[None]:
    yield
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    _ctrl_c_as_from_a_terminal()
    assert not (ignored or blocked), (
        f"SIGINT was left {'ignored' if ignored else 'blocked'} in the test process (put back now): "
        "every process started after this test would have ignored Ctrl-C"
    )


def _ctrl_c_as_from_a_terminal() -> None:
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


@pytest.hookimpl(trylast=True)  # after pytest's own, which makes the temporary root
def pytest_configure(config: pytest.Config) -> None:
    _ctrl_c_as_from_a_terminal()
    if hasattr(config, "workerinput"):  # a distributed worker: the controller checks
        return
    token = uuid.uuid4().hex
    os.environ[MARK] = token
    _state["token"] = token
    _state["root"] = Path(str(config.rootpath))
    _state["status"] = _git_status(Path(str(config.rootpath)))
    _state["tmp"] = _entries()
    _state["users"] = {u.pw_name for u in pwd.getpwall()}
    # The run's temporary root (created now, as pytest's tmp_path would): torch's and Ray's caches
    # go there, set before any test or fixture starts a process that inherits them.
    base = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    for var, name in (("TORCHINDUCTOR_CACHE_DIR", "torchinductor"), ("TRITON_CACHE_DIR", "triton")):
        os.environ.setdefault(var, str(base / name))
    # Ray's sockets live under its temp dir: pytest's root is short enough for their 107 bytes.
    os.environ.setdefault("RAY_TMPDIR", str(base / "ray"))
    from krex_lab.enforcement.corelock import default_path

    lock = default_path()
    _state["core_lock"] = None if lock.exists() or str(lock).startswith("/run") else lock


@pytest.hookimpl(trylast=True)  # after xdist's, which ends its workers (marked processes too)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    token = _state.get("token")
    if not isinstance(token, str):
        return
    problems: list[str] = []
    deadline = time.monotonic() + GRACE_S
    left = _marked(token)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    if left:
        problems.append("processes the run started outlive it (killed now):")
        problems += [f"  {_describe(p)}" for p in left]
        for proc in left:
            try:
                proc.kill()
            except psutil.Error:
                pass
    _remove_if_free(_state.get("core_lock"))
    since = _state.get("tmp")
    if isinstance(since, set) and (ownerless := _ownerless(since)):
        problems.append("files of users the run made and deleted (removed now):")
        problems += [f"  {path}" for path in ownerless]
        for path in ownerless:
            _remove(path)
    users = _state.get("users")
    if isinstance(users, set) and (made := sorted({u.pw_name for u in pwd.getpwall()} - users)):
        problems.append(f"users the run made and left in the passwd database: {', '.join(made)}")
    root = _state["root"]
    assert isinstance(root, Path)
    before, after = _state.get("status"), _git_status(root)
    if isinstance(before, str) and after is not None and before != after:
        was, now = set(before.splitlines()), set(after.splitlines())
        problems.append("the run changed the checkout (git status --porcelain):")
        problems += [f"  now:    {line}" for line in sorted(now - was)]
        problems += [f"  before: {line}" for line in sorted(was - now)]
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = "\n".join(["", "what the run left behind:", *problems])
        if reporter is not None:
            reporter.write_line(text, red=True)
        else:
            print(text)
        if session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _remove_if_free(lock: object) -> None:
    """A lock file the run made, removed unless a process has it open (an arbiter keeps it open
    from its start, and takes the lock only to reserve cores: a lab started meanwhile keeps it).
    A holder has ``GRACE_S`` to let go: an arbiter's guardian, or a process killed just now, still
    has it open for a moment after the run's last test."""
    if not isinstance(lock, Path) or not lock.exists():
        return
    deadline = time.monotonic() + GRACE_S
    # the run's own process is no holder that counts: the in-process core books of the scheduler's
    # tests keep the file open until the interpreter exits, and the name can go from under them
    while any(_holds(p, str(lock)) for p in psutil.process_iter(["open_files"]) if p.pid != os.getpid()):
        if time.monotonic() > deadline:
            return
        time.sleep(0.2)
    lock.unlink(missing_ok=True)


def _holds(proc: psutil.Process, path: str) -> bool:
    return any(f.path == path for f in proc.info["open_files"] or ())
