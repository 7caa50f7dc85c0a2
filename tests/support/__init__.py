"""Helpers for the tests that need the tests' own helper processes (``tests/procs``) or a pool.

The generic fixtures (``arbiter``, ``ArbiterProc``, ``wait_for``, ``cpu_gain``) live in
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
