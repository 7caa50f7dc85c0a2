"""How ``make test`` spreads the suite over two pytest-xdist workers: a pytest plugin, loaded by
``tests/conftest.py``. ``make test`` runs the suite in two passes:

1. ``-n 2 -m "not serial"``: two workers. A test file runs whole on one worker, so that its
   module-scoped arbiter or pool starts once; the evaluator's files (``tests/evaluate/``) share one
   worker, and with it their package-scoped arbiter and torch-warm pool. The files of
   :data:`ONE_AT_A_TIME_FILES` run one after another on one worker: node-wide daemons (Slurm,
   JupyterHubs with real users) and answers held to 0.1-2 s.
   Each worker's arbiters reserve cores under a lock of the worker's own (``KREX_TEST_CORE_LOCK``):
   their regions move their own sessions only (``--Arbiter.shield=sessions``), so two workers'
   books never touch the same threads, and a region of one worker still gets its cores while the
   other worker's holds some.
2. ``-m serial``: the files of :data:`SERIAL_FILES`, one process, nothing beside them, under the
   node's lock. They take that lock on purpose, shield in ``affinity`` mode (every process of the
   node moves: an embedded lab arbiter's default), assert what cgroups or a shield did, time a
   candidate against a bound, or let hostile candidates change the machine (the red-team corpus).

Without xdist (a file run by hand) the plugin only marks; ``-m`` is then the caller's choice.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

#: the marker of the files that run alone, after the parallel pass
SERIAL = "serial"
SERIAL_FILES = frozenset(
    {
        # affinity shields, the node's core lock, cgroups, regions asserted to get their cores (a
        # region of the other worker's holding the node's lock would leave them none)
        "tests/enforcement/test_cgroup_limits.py",
        "tests/enforcement/test_cgroups.py",
        "tests/enforcement/test_enforcement_units.py",
        "tests/enforcement/test_node_core_lock.py",
        "tests/enforcement/test_shield.py",
        "tests/enforcement/test_tree_walk.py",
        "tests/security/test_core_lock.py",
        "tests/security/test_shield_rewiden.py",
        "tests/test_exclusive_degraded_terminal.py",
        "tests/hub/test_admin_service.py",
        # a candidate's measured time against a bound
        "tests/evaluate/test_outside_time.py",
        # the red-team corpus: its lasting cheats patch what the machine's next interpreters load,
        # signal, renice and pin processes; beside it, the other worker's sandbox tests failed
        "tests/evaluate/test_redteam.py",
        # embedded lab arbiters: their default shield (affinity) moves every process of the node,
        # the other worker's too, under the node's lock while the other worker's arbiters take theirs
        "tests/serverext/test_serverext.py",
        "tests/serverext/test_lab_shutdown.py",
        "tests/serverext/test_lab_pool_gpus.py",
        "tests/serverext/test_lab_and_cli_agree.py",
        "tests/dashboard/test_dashboard_browser.py",
        "tests/test_lab_browser.py",
        "tests/arbiter/test_startup_lines.py",
        "tests/hub/test_extension_choice.py",
    }
)
#: the group of the parallel pass's files that run one after another on one worker, the other
#: worker running other files meanwhile
ONE_AT_A_TIME = "one at a time"
ONE_AT_A_TIME_FILES = frozenset(
    {
        # daemons of the whole node: Slurm's, JupyterHubs with real users
        "tests/test_slurm.py",
        "tests/test_jupyterhub.py",
        "tests/test_jupyterhub_browser.py",
        # an arbiter's answer within 0.1-1 s, a release within 0.6 s, a cell within 2 s
        "tests/security/test_arbiter_threads.py",
        "tests/security/test_arbiter_floods.py",
        "tests/security/test_fuzz.py",
        "tests/security/test_fair_share_costs.py",
        "tests/security/test_connection_flood.py",
        "tests/arbiter/test_history.py",
        "tests/arbiter/test_arbiter_regions.py",
        "tests/test_kernels.py",
    }
)
#: where a worker's arbiters (:class:`krex_lab.pytest_plugin.ArbiterProc`) take their core lock
CORE_LOCK_ENV = "KREX_TEST_CORE_LOCK"
#: the directories whose files share one worker (a package-scoped fixture: one start, not one a file)
SHARED_DIRS = ("tests/evaluate/",)


def group_of(relpath: str) -> str:
    """The xdist group of a test file, by its path relative to the repository root."""
    if relpath in ONE_AT_A_TIME_FILES:
        return ONE_AT_A_TIME
    for shared in SHARED_DIRS:
        if relpath.startswith(shared):
            return shared
    return relpath


def _relpath(item: pytest.Item) -> str:
    path = Path(str(item.path)).resolve()
    root = Path(str(item.config.rootpath)).resolve()
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()


@pytest.hookimpl(trylast=True)  # after pytest's own, which makes the temporary root
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{SERIAL}: runs alone, after the parallel pass (tests/support/workers.py)")
    # the run's arbiters take their core lock in its own temporary root (each xdist worker's own):
    # a user without a runtime dir would find /tmp/krex-cores-UID.lock left by the suite otherwise
    base = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    if hasattr(config, "workerinput"):
        os.environ[CORE_LOCK_ENV] = str(base / "krex-cores.lock")
    else:
        os.environ.setdefault(CORE_LOCK_ENV, str(base / "krex-cores.lock"))


@pytest.hookimpl(tryfirst=True)  # before pytest's own, which deselects by marker (-m)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _relpath(item) in SERIAL_FILES:
            item.add_marker(SERIAL)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: a run without xdist never calls it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scheduler by scope, a scope being :func:`group_of` a test's file."""
    from xdist.scheduler import LoadScopeScheduling

    class FileGroups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid.split("::", 1)[0])

    return FileGroups(config, log)
