"""Helpers for the tests that need the tests' own helper processes (``tests/procs``) or a pool.

The generic fixtures (``krex_arbiter``, ``ArbiterProc``, ``wait_for``, ``cpu_gain``) live in
``krex_lab.pytest_plugin``.
"""

import os
import pwd
from pathlib import Path

#: The checkout's root: the working directory for ``python -m tests.procs...``, and where
#: ``notebooks/`` and ``test-artifacts/`` are.
ROOT = Path(__file__).resolve().parents[2]

#: Who runs the tests: the name the arbiter records for their regions (root in CI, anyone else
#: on a developer's machine).
ME = pwd.getpwuid(os.geteuid()).pw_name


def frozen(pid: int) -> bool:
    """Stopped (SIGSTOP), or in a frozen cgroup (the cgroup freezer, a root multi-user arbiter's
    default where the machine has cgroup v2: a frozen task shows as sleeping, not stopped)."""
    from krex_lab.enforcement.cgroups import cgroup_of, is_frozen, v2_root
    from krex_lab.procutil import proc_state

    if proc_state(pid) == "T":
        return True
    root, cgroup = v2_root(), cgroup_of(pid)
    return bool(root and cgroup and cgroup != "/" and is_frozen(f"{root}{cgroup}"))
