"""The node's core lock and the shield against a hostile neighbour (hostile neighbours, round two).

A region keeps everyone else on the node off its reserved cores (in ``affinity`` shield mode,
every process of every user). Any user could ask for ``cores=1024``: all but one core of the node
for the whole hold. A multi-user arbiter now caps it per user (``Quotas.max_cores``, an eighth
of the node by default).

A root arbiter reserves a region's cores under one ``flock`` on the node (``enforcement/corelock.py``);
whoever holds it keeps every region of the node from reserving cores (each gets none, degraded).
The lock file is root's, 0600: ``mallory`` cannot open it. A lock file that others may open (an
admin's ``touch`` under umask 022, an older install) was used as it was: mallory opened it and
held it, and alice's regions got no cores. The arbiter now replaces such a file with a fresh one
that only it can open, so a descriptor opened before is of no use.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from .helpers_arbiter import Agent, agents, assert_healthy, kill_tree, multi_user_arbiter, read_line, spawn_as
from .users import User

HOLD_LOCK = r"""
import fcntl
fd = int(ARGS[0]) if ARGS[0].isdigit() else None
try:
    if fd is None:
        fd = os.open(ARGS[0], os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    out(held=True)
except OSError as exc:
    out(held=False, error=str(exc))
sys.stdin.readline()
"""


def test_a_user_cannot_hold_the_node_core_lock(mallory: User, alice: User) -> None:
    if len(os.sched_getaffinity(0)) < 2:  # a one-core machine, or another arbiter's shield narrowed us
        pytest.skip("this process may run on one core only: a region would reserve none")
    tmp = Path(tempfile.mkdtemp(prefix="krex-sec-cores-"))
    os.chmod(tmp, 0o755)
    lock = tmp / "cores.lock"
    lock.touch(mode=0o644)  # an admin's touch, an older install: others may open it
    # mallory opens it before any arbiter runs, and will hold it as soon as she can
    early = os.open(lock, os.O_RDONLY)
    holder = None
    try:
        with multi_user_arbiter(f"--Arbiter.core_lock={lock}") as arb, agents() as made:
            assert lock.stat().st_mode & 0o077 == 0, "the arbiter narrows the lock file to itself"
            # mallory: through the descriptor she opened before, else by name (refused now)
            holder = spawn_as(mallory, arb, HOLD_LOCK, str(lock))
            by_name = read_line(holder)
            assert not by_name["held"] and "Permission denied" in by_name["error"], by_name
            kill_tree(holder.pid)
            holder.wait(5)
            import fcntl

            fcntl.flock(early, fcntl.LOCK_SH | fcntl.LOCK_NB)  # the early descriptor, held (root's here)
            a = Agent(alice, arb)
            made.append(a)
            assert a.call("register", tag="a", gpu=0)["ok"]
            a.call("acquire", tag="r", session="a", opts={"gpu": 0, "max_hold": 30, "freeze": False})
            granted = a.event("granted|acquire_failed", "r")
            assert granted["event"] == "granted", granted
            report = granted["report"]
            assert report["cores"], f"alice's region got no cores: {report['failures']}"
            assert a.call("release", tag="r")["ok"]
            time.sleep(0.2)
            assert_healthy(arb, {mallory.uid, alice.uid})
    finally:
        os.close(early)
        if holder is not None and holder.poll() is None:
            kill_tree(holder.pid)
        for p in tmp.iterdir():
            p.unlink()
        tmp.rmdir()


def test_a_user_cannot_reserve_the_whole_node(mallory: User) -> None:
    with multi_user_arbiter() as arb, agents() as made:
        m = Agent(mallory, arb)
        made.append(m)
        assert m.call("register", tag="m", gpu=0)["ok"]
        m.call("acquire", tag="all", session="m", opts={"gpu": 0, "max_hold": 30, "freeze": False, "cores": 1024})
        refused = m.event("granted|acquire_failed", "all")
        assert refused["event"] == "acquire_failed", refused["report"]["cores"] if "report" in refused else refused
        assert refused["error"]["type"] == "QuotaExceeded" and "max_cores=" in refused["error"]["message"], refused
        # the default ask (the operator's Arbiter.isolate_cores) is granted
        m.call("acquire", tag="one", session="m", opts={"gpu": 0, "max_hold": 30, "freeze": False})
        assert m.event("granted|acquire_failed", "one")["event"] == "granted"
        assert m.call("release", tag="one")["ok"]
        assert_healthy(arb, {mallory.uid})
