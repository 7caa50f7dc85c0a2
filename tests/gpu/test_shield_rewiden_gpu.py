"""The reserved core beside a neighbour who widens its affinity again, on the GPU machine.

The same scenario as tests/security/test_shield_rewiden.py (alice's timing loop in a region of
one reserved core, one of mallory's busy loops per core, real users against a root arbiter with
``Arbiter.guard_neighbours``), here for the shields the GPU machine's pure cgroup v2 offers: a
``cpuset`` partition, where the kernel clamps any affinity a process asks for (the holder keeps
>= 95% of its rate), and ``affinity`` with the watch (>= 85%, or the report is degraded and
names them). The GPU itself is not used (fake backend): it is marked ``gpu`` to run there.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from krex_lab.enforcement.shield import CpusetPartition
from tests.security.helpers_arbiter import multi_user_arbiter
from tests.security.rewiden import CPUS, MODES, diagnosis, region_beside
from tests.security.users import make_user

pytestmark = pytest.mark.gpu


def check(shield: str, results: dict[str, tuple[dict[str, Any], list[int]]]) -> None:
    (plain, _), (once, once_pids), (always, always_pids) = (results[m] for m in MODES)
    shares = {"once": once["rate"] / plain["rate"], "always": always["rate"] / plain["rate"]}
    print(
        f"{shield}: shield {plain['report']['shield']['mode']}, holder's rate beside plain loops "
        f"{plain['rate']:.0f}/s; beside loops that widen once {shares['once']:.1%}, always "
        f"{shares['always']:.1%}; intrusions once {once['report']['shield'].get('intrusions')}, "
        f"always {always['report']['shield'].get('intrusions')}"
    )
    said = plain["report"]["shield"]
    if shield == "cpuset" and said["mode"] != "cpuset":
        # the arbiter keeps a holder in a cgroup whose limits a partition would lift (a machine that
        # runs each command under a memory limit): it said so, and used affinities
        lifted = [n for n in said.get("notes", []) if "a partition would lift" in n]
        if lifted:
            pytest.skip(f"the holder's cgroup rules out a partition here: {lifted[0]}")
    assert said["mode"] == shield, said
    if shield == "cpuset":
        assert shares["once"] >= 0.95 and shares["always"] >= 0.95, shares
        return
    named = {i["pid"] for i in once["report"]["shield"].get("intrusions", [])} & set(once_pids)
    assert shares["once"] >= 0.85 or (once["report"]["degraded"] and named), (shares, once["report"])
    found = [i for i in always["report"]["shield"].get("intrusions", []) if i["pid"] in always_pids]
    assert shares["always"] >= 0.85 or (always["report"]["degraded"] and found), (shares, always["report"])


@pytest.mark.skipif(len(CPUS) < 2, reason="a shield needs a core to reserve and one to keep")
@pytest.mark.parametrize("shield", ["cpuset", "affinity"])
def test_the_holder_keeps_its_core_beside_neighbours_that_widen_themselves(shield: str) -> None:
    if shield == "cpuset":
        why = CpusetPartition().reason if os.geteuid() == 0 else "not root"
        if why:
            pytest.skip(f"no cpuset partitions here: {why}")
    results: dict[str, tuple[dict[str, Any], list[int]]] = {}
    with (
        make_user("krexalice") as alice,
        make_user("krexmal") as mallory,
        multi_user_arbiter("--guard-neighbours", f"--Arbiter.shield={shield}") as arb,
    ):
        try:
            for mode in MODES:
                results[mode] = region_beside(alice, mallory, arb, mode)
            check(shield, results)
        except BaseException:  # one device run tells the whole story (pytest shows it on failure)
            print(diagnosis(arb, results))
            raise
