"""The shared fixtures come from the package's pytest plugin (``krex_arbiter``, ``krex_stopped``;
named so that they collide with no project's own, as jupyter_server's ``jp_`` ones); here the
tests' short names for them, and those that need the tests' own helper processes."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

pytest.register_assert_rewrite("krex_lab.pytest_plugin")  # imported below, before pytest_plugins loads it

# No test may wander onto a node arbiter that happens to run on this machine (/run/krex): the
# servers the tests start look for one only where a test says so.
os.environ.setdefault("KREX_NODE_ENDPOINT", "")


from krex_lab.pytest_plugin import ArbiterProc  # noqa: E402
from tests.support.procs import Procs, session_processes  # noqa: E402

# tests.support.leftovers: caches in the run's temporary root; no stray process or file at the end
pytest_plugins = ["krex_lab.pytest_plugin", "tests.support.browser", "tests.support.leftovers", "tests.support.workers"]


@pytest.fixture
def arbiter(krex_arbiter: ArbiterProc) -> ArbiterProc:
    """The plugin's ``krex_arbiter``: a started fake-backend arbiter, this process's default."""
    return krex_arbiter


@pytest.fixture
def stopped(krex_stopped: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """The plugin's ``krex_stopped``: a SIGSTOPped ``sleep``."""
    return krex_stopped


@pytest.fixture
def procs(arbiter: ArbiterProc) -> Iterator[Procs]:
    """Session processes (``tests.procs.session``) on the ``arbiter`` fixture's arbiter; killed after."""
    yield from session_processes(arbiter)


def _masks() -> dict[int, set[int]]:
    """Allowed CPUs of this process, its parent and PID 1: what a region's shield moves and must
    give back (a leak here pins everything started afterwards, the next CI run included)."""
    masks = {}
    for pid in {os.getpid(), os.getppid(), 1}:
        try:
            masks[pid] = set(os.sched_getaffinity(pid))
        except OSError:
            continue
    return masks


def _other_arbiter_shields() -> bool:
    """A region of an arbiter outside the tests (a lab, a benchmark) holds cores: its shield moves
    these processes too, and gives them back at its release, not ours."""
    from krex_lab.enforcement.corelock import NodeCoreLock

    probe = NodeCoreLock()
    try:
        return "another KREX arbiter" in probe.acquire()
    finally:
        probe.close()


@pytest.fixture(autouse=True)
def no_affinity_left_behind() -> Iterator[None]:
    before = _masks()
    yield
    after = _masks()
    if after != before and _other_arbiter_shields():
        return
    # Only a narrowing leaks. A mask wider now than before was narrowed, at this test's start, by a
    # region that lingered from the test before (a module-scoped pool's arbiter) and has since given
    # it back: "restoring" that would pin everything after this test.
    leaked = {pid: (after[pid], mask) for pid, mask in before.items() if not after.get(pid, mask) >= mask}
    for pid, (_, mask) in leaked.items():
        os.sched_setaffinity(pid, mask)  # so that the tests after this one run on the whole machine
    assert not leaked, f"allowed CPUs left changed (pid: (now, before)): {leaked}"
