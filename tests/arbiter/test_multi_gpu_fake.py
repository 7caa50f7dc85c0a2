"""Two (fake) GPUs of one node: regions on both at once, and a GPU-1 session through a GPU-0 region.

What test_arbiter_regions.py already shows is not repeated here (one region freezing its GPU's
siblings while another GPU's session keeps running and gets its main thread's affinity back).
"""

from __future__ import annotations

import os

import pytest

from krex_lab.procutil import proc_state, threads, tree
from krex_lab.pytest_plugin import ArbiterProc, cpu_gain, wait_for
from tests.support.procs import Procs

pytestmark = pytest.mark.timeout(60)

CPUS = sorted(os.sched_getaffinity(0))


def _running(pid: int) -> bool:
    return all(proc_state(p) in ("R", "S") for p in tree(pid))


def test_regions_on_gpu0_and_gpu1_held_at_once(arbiter: ArbiterProc, procs: Procs) -> None:
    sib0 = procs.start("sibling", "0", "--child")
    sib1 = procs.start("sibling", "1")
    wait_for(lambda: len(tree(sib0.pid)) == 2)
    h0 = procs.start("holder", "0", "--hold", "3.0", wait_line=None)
    line = procs.readline(h0)
    assert line.startswith("granted"), line
    g0 = procs.report(line)
    h1 = procs.start("holder", "1", "--hold", "1.5", wait_line=None)
    line = procs.readline(h1)
    assert line.startswith("granted"), line
    g1 = procs.report(line)

    # Both held now: each GPU has its own holder and a closed gate.
    gpus = arbiter.status()["gpus"]
    assert [g["holder"]["pid"] for g in gpus] == [h0.pid, h1.pid]
    assert [g["gate"] for g in gpus] == ["closed", "closed"]
    # Each region froze its own GPU's siblings and nothing of the other GPU, holders included.
    assert sorted(g0["frozen"]) == sorted(tree(sib0.pid))
    assert g1["frozen"] == [sib1.pid]
    assert cpu_gain(sib0.pid) == pytest.approx(0.0, abs=0.02)
    assert cpu_gain(sib1.pid) == pytest.approx(0.0, abs=0.02)
    assert proc_state(h0.pid) in ("R", "S") and proc_state(h1.pid) in ("R", "S"), "no holder stops the other"

    # Reserved cores: disjoint where there are enough; otherwise the second region says it has none.
    c0, c1 = set(g0["cores"]), set(g1["cores"])
    assert c0 and 0 not in c0 and not g0["degraded"]
    if len(CPUS) >= 3:
        assert c1 and not c0 & c1, "two regions never share a reserved core"
        assert not g1["degraded"]
        assert os.sched_getaffinity(h0.pid) == c0 and os.sched_getaffinity(h1.pid) == c1
    else:
        assert c1 == set(), "the last free core is never reserved, nor shared"
        assert g1["degraded"] is True
        assert any("no core to reserve" in f for f in g1["failures"]), g1["failures"]

    r1 = procs.report(procs.readline(h1, timeout=10))
    r0 = procs.report(procs.readline(h0, timeout=10))
    # The hold intervals [granted, about to release] overlap.
    assert max(g0["t"], g1["t"]) < min(r0["t_end"], r1["t_end"])
    assert r1["t_end"] - g1["t"] >= 1.5 and r0["t_end"] > r1["t_end"]
    assert r0["released_by"] == r1["released_by"] == "released by holder"
    wait_for(lambda: _running(sib0.pid) and _running(sib1.pid), timeout=2.0)


def test_gpu1_session_runs_through_gpu0_region_and_gets_its_affinity_back(arbiter: ArbiterProc, procs: Procs) -> None:
    other = procs.start("sibling", "1", "--child")
    wait_for(lambda: len(tree(other.pid)) == 2)
    parent, child = tree(other.pid)
    # Affinities its user chose (not "all cores"), different for parent and child, on every thread.
    if len(CPUS) >= 3:
        chosen = {parent: {CPUS[0], CPUS[-1]}, child: {CPUS[1], CPUS[-1]}}
    else:
        chosen = {parent: set(CPUS), child: set(CPUS)}
    original: dict[int, set[int]] = {}
    for pid, cpus in chosen.items():
        for tid in threads([pid]):
            os.sched_setaffinity(tid, cpus)
            original[tid] = os.sched_getaffinity(tid)
    assert len(original) > 2, "the session's own threads (control, zmq) count too"

    holder = procs.start("holder", "0", "--hold", "1.0", wait_line=None)
    line = procs.readline(holder)
    assert line.startswith("granted"), line
    granted = procs.report(line)
    reserved = set(granted["cores"])
    assert reserved and 0 not in reserved
    assert {parent, child} <= set(granted["moved"])
    assert not {parent, child} & set(granted["frozen"] + granted["drained"] + granted["locked"])
    assert str(parent) not in granted["not_drained"], "a session of another GPU is not asked to drain"
    assert cpu_gain(other.pid) > 0.05, "it keeps running"
    assert _running(other.pid)
    for tid, cpus in original.items():
        assert os.sched_getaffinity(tid) == cpus - reserved, f"thread {tid}"

    line = procs.readline(holder, timeout=10)
    assert line.startswith("released"), line
    wait_for(lambda: all(os.sched_getaffinity(t) == cpus for t, cpus in original.items()), timeout=2.0)
