"""The shared fixtures come from the package's pytest plugin (``arbiter``, ``wait_for``, ...);
here only those that need the tests' own helper processes."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytest.register_assert_rewrite("krex_lab.pytest_plugin")  # imported below, before pytest_plugins loads it

# No test may wander onto a node arbiter that happens to run on this machine (/run/krex): the
# servers the tests start look for one only where a test says so.
os.environ.setdefault("KREX_NODE_ENDPOINT", "")

from krex_lab.pytest_plugin import ArbiterProc  # noqa: E402
from tests.support.procs import Procs, session_processes  # noqa: E402

pytest_plugins = ["krex_lab.pytest_plugin", "tests.support.browser"]


@pytest.fixture
def procs(arbiter: ArbiterProc) -> Iterator[Procs]:
    """Session processes (``tests.procs.session``) on the ``arbiter`` fixture's arbiter; killed after."""
    yield from session_processes(arbiter)
