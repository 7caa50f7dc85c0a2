"""A region with hundreds of siblings reads their /proc files through kept descriptors: how many
the arbiter keeps follows its descriptor limit (real arbiter, real sleeping processes)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import krex_lab
from krex_lab.arbiter.quotas import kept_files_limit, node_session_capacity
from krex_lab.client import Session
from krex_lab.procfiles import KeptFiles
from krex_lab.procutil import proc_state
from krex_lab.pytest_plugin import ArbiterProc, running_arbiter, wait_for

SIBLINGS = 200


@pytest.fixture
def roomy_arbiter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ArbiterProc]:
    yield from running_arbiter(
        tmp_path,
        monkeypatch,
        extra=(f"--Quotas.sessions_per_user={SIBLINGS + 8}", f"--Quotas.sessions_per_process={SIBLINGS + 8}"),
    )


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_every_sibling_of_a_200_sibling_region_keeps_its_files(roomy_arbiter: ArbiterProc) -> None:
    # Each sibling keeps three files (its pidfd, its stat and its children file). At the old fixed
    # 512 in all, half of 200 siblings' reads opened and closed their files every region.
    assert roomy_arbiter.proc is not None
    arbiter_pid = roomy_arbiter.proc.pid
    kids = [subprocess.Popen(["sleep", "600"]) for _ in range(SIBLINGS)]
    sessions: list[Session] = []
    try:
        sessions = [Session(gpu=0, pid=k.pid, name="sibling", control=False) for k in kids]
        before = _fds(arbiter_pid)
        with krex_lab.exclusive(gpu=0) as region:
            assert len(region.report["frozen"]) == SIBLINGS
        wait_for(lambda: all(proc_state(k.pid) != "T" for k in kids), timeout=10)
        kept = _fds(arbiter_pid) - before
        assert kept >= 3 * SIBLINGS > KeptFiles.LIMIT, f"the arbiter kept {kept} descriptors for {SIBLINGS} siblings"
    finally:
        for s in sessions:
            s.close()
        for k in kids:
            k.kill()
            k.wait()


def test_the_kept_files_limit_and_the_session_capacity_share_the_descriptor_limit() -> None:
    for fd_limit in (1024, 4096, 20000, 1 << 20):
        kept = kept_files_limit(fd_limit)
        assert kept >= KeptFiles.LIMIT
        # what sessions cost (a pidfd and a connection each) and what is kept fit in the limit
        assert 256 + kept + 2 * node_session_capacity(fd_limit) <= max(fd_limit, 256 + kept + 32)
        # placed in cgroups, a session keeps three more (enforcement/freeze.FreezeFiles)
        assert 256 + kept + 5 * node_session_capacity(fd_limit, placed=True) <= max(fd_limit, 256 + kept + 80)
    assert kept_files_limit(20000) == 5000
