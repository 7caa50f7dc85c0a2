"""A session that cannot answer a drain because it is stopped costs no region its drain timeout.

Real arbiter (fake backend, 2 GPUs) and real session processes (``tests.procs.session``). The
regions ask for no reserved core (``--cores 0``): two regions at once on a 2-core machine would
otherwise find no core to reserve, a degradation of its own.
"""

from __future__ import annotations

import pytest

from krex_lab.procutil import proc_state, tree
from krex_lab.pytest_plugin import ArbiterProc, wait_for
from tests.support.procs import Procs

pytestmark = pytest.mark.timeout(60)


def _granted(procs: Procs, *args: str) -> dict:
    holder = procs.start("holder", *args, "--cores", "0", wait_line=None)
    line = procs.readline(holder)
    assert line.startswith("granted"), line
    return procs.report(line)


def test_a_process_frozen_by_the_other_gpus_region_costs_no_drain_timeout(arbiter: ArbiterProc, procs: Procs) -> None:
    # One process, a session on each GPU (its first on GPU 0, a second for GPU 1).
    both = procs.start("sibling", "0", "--sleep", "--also-gpu", "1")
    g1 = _granted(procs, "1")  # held until the test ends
    assert both.pid in g1["frozen"] and g1["degraded"] is False, g1
    wait_for(lambda: proc_state(both.pid) == "T")

    g0 = _granted(procs, "0", "--hold", "0.2")
    # It can neither answer nor submit GPU work: not waited for, left stopped, and said so.
    assert str(both.pid) not in g0["not_drained"], g0["not_drained"]
    assert g0["degraded"] is False, g0
    assert both.pid in g0["skipped_stopped"] and both.pid not in g0["frozen"], g0
    assert g0["drain_s"] < 0.5, g0["drain_s"]  # the drain timeout is 1 s
    assert both.pid not in g0["drained"]


def test_a_session_started_by_a_sibling_session_is_not_stopped_before_it_answers(
    arbiter: ArbiterProc, procs: Procs
) -> None:
    # A notebook's kernel (the sibling) and a loop it started that is a session of its own on the
    # same GPU, slower to answer a drain (0.3 s) than the kernel: the kernel's answer freezes its
    # tree, which must not stop the loop before the loop has answered.
    kernel = procs.start("sibling", "0", "--sleep", "--child-session")
    loop = tree(kernel.pid)[1]
    g0 = _granted(procs, "0", "--hold", "0.2")
    assert g0["not_drained"] == {} and g0["degraded"] is False, g0
    assert sorted(g0["drained"]) == sorted([kernel.pid, loop])
    assert {kernel.pid, loop} <= set(g0["frozen"])
    assert g0["drain_s"] < 0.9, g0["drain_s"]  # the loop's 0.3 s, not the 1 s timeout
