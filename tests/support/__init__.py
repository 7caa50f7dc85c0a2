"""Helpers for the tests that need the tests' own helper processes (``tests/procs``) or a pool.

The generic fixtures (``krex_arbiter``, ``ArbiterProc``, ``wait_for``, ``cpu_gain``) live in
``krex_lab.pytest_plugin``.
"""

import os
import pwd
import tempfile
from pathlib import Path

#: The checkout's root: the working directory for ``python -m tests.procs...``, where
#: ``notebooks/`` is.
ROOT = Path(__file__).resolve().parents[2]

#: Who runs the tests: the name the arbiter records for their regions (root in CI, anyone else
#: on a developer's machine).
ME = pwd.getpwuid(os.geteuid()).pw_name


def artifacts_dir() -> Path:
    """Where the browser tests put their screenshots: ``KREX_TEST_ARTIFACTS`` when set, else a
    folder in pytest's own temporary root (``/tmp/pytest-of-USER``), never in the checkout."""
    named = os.environ.get("KREX_TEST_ARTIFACTS")
    path = Path(named) if named else Path(tempfile.gettempdir()) / f"pytest-of-{ME}" / "krex-artifacts"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def frozen(pid: int) -> bool:
    """Stopped (SIGSTOP), or in a frozen cgroup (the cgroup freezer, a root multi-user arbiter's
    default where the machine has cgroup v2: a frozen task shows as sleeping, not stopped)."""
    from krex_lab.enforcement.cgroups import cgroup_of, is_frozen, v2_root
    from krex_lab.procutil import proc_state

    if proc_state(pid) == "T":
        return True
    root, cgroup = v2_root(), cgroup_of(pid)
    return bool(root and cgroup and cgroup != "/" and is_frozen(f"{root}{cgroup}"))
