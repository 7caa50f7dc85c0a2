"""procutil.tree with kept children files: every walk sees the tree as it is now, on real processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from krex_lab.procfiles import KEPT
from krex_lab.procutil import proc_state, session_tree, state_and_threads, tree
from krex_lab.pytest_plugin import wait_for

# A process that, on each line of stdin, forks a `sleep` from its main thread ("main") or from a
# new thread that stays ("hold"), or ends its last child ("end"), and prints its last child's pid.
FORKER = r"""
import subprocess, sys, threading
kids = []
def fork():
    kids.append(subprocess.Popen(["sleep", "60"]))
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "main":
        fork()
    elif cmd == "end":
        k = kids.pop(); k.kill(); k.wait()
    elif cmd == "hold":
        # a thread that stays, forking now: its own children file lists the child
        ev = threading.Event()
        def forker():
            fork(); ev.set(); threading.Event().wait()
        threading.Thread(target=forker, daemon=True).start(); ev.wait()
    print(kids[-1].pid if kids else 0, flush=True)
"""


@pytest.fixture
def forker() -> Iterator[subprocess.Popen[str]]:
    p = subprocess.Popen(
        [sys.executable, "-c", FORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    yield p
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)  # its sleeps too
    p.wait()


def ask(p: subprocess.Popen[str], cmd: str) -> int:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(cmd + "\n")
    p.stdin.flush()
    return int(p.stdout.readline())


def test_every_walk_sees_children_forked_and_ended_since_the_last(forker: subprocess.Popen[str]) -> None:
    assert tree(forker.pid, kept=True) == [forker.pid]  # the first walk keeps its descriptors
    a = ask(forker, "main")
    b = ask(forker, "hold")  # forked by a thread born after the first walk
    assert sorted(tree(forker.pid, kept=True)) == sorted([forker.pid, a, b])
    ask(forker, "end")  # b ends (and is reaped)
    wait_for(lambda: sorted(tree(forker.pid, kept=True)) == sorted([forker.pid, a]), timeout=5)
    assert sorted(tree(forker.pid, kept=True)) == sorted([forker.pid, a])


def test_a_walk_after_a_pid_changes_hands_reads_the_new_process(forker: subprocess.Popen[str]) -> None:
    tree(forker.pid, kept=True)
    files = KEPT
    assert files.kept(forker.pid), "the walk kept its descriptors (pidfds are given here)"
    forker.kill()
    forker.wait()
    # The kept entry is checked before use: its process has ended, so it is let go at once.
    assert tree(forker.pid, kept=True) == []
    assert files.read(forker.pid, ["stat"]) == [None]
    assert not files.kept(forker.pid)


def test_kept_descriptors_of_processes_not_walked_again_are_closed(
    forker: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    files = KEPT
    before = len(os.listdir("/proc/self/fd"))
    tree(forker.pid, kept=True)
    assert len(os.listdir("/proc/self/fd")) > before
    monkeypatch.setattr(files, "SWEEP", 0.0)
    forker.kill()
    forker.wait()
    tree(os.getpid(), kept=True)  # any kept walk sweeps: the ended process's descriptors go
    assert not files.kept(forker.pid)
    files.clear()
    assert len(os.listdir("/proc/self/fd")) <= before


def test_only_the_root_of_a_walked_tree_keeps_descriptors(forker: subprocess.Popen[str]) -> None:
    # A root is a session or a GPU process (the arbiter bounds them); its descendants are as many
    # as a user makes: each walk reads theirs afresh instead of keeping a descriptor of each.
    kids = [ask(forker, "main") for _ in range(5)]
    assert sorted(tree(forker.pid, kept=True)) == sorted([forker.pid, *kids])
    assert KEPT.kept(forker.pid)
    assert not any(KEPT.kept(k) for k in kids)
    KEPT.forget(forker.pid)  # a session that ends lets its files go at once
    assert not KEPT.kept(forker.pid)


def test_a_walk_keeps_nothing_unless_asked(forker: subprocess.Popen[str]) -> None:
    # Workers and the pool walk their own trees too; they run user code, which may close any
    # descriptor, so only the arbiter's freeze asks for kept ones.
    KEPT.forget(forker.pid)
    kid = ask(forker, "main")
    assert sorted(tree(forker.pid)) == sorted([forker.pid, kid])
    assert not KEPT.kept(forker.pid)


def test_a_stopped_root_is_walked_by_the_thread_count_read_once_it_stopped(forker: subprocess.Popen[str]) -> None:
    # The settle walks a stopped root of one thread from its leader's children file alone: the
    # count must come from a read made after the stop, or a thread born just before it (and its
    # children) would be missed.
    a = ask(forker, "main")
    for expect_threads, kids in ((1, [a]), (2, None)):
        if kids is None:
            kids = [a, ask(forker, "hold")]  # a second thread, which forks
        os.kill(forker.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: proc_state(forker.pid) == "T", timeout=5)
            state, threads = state_and_threads(forker.pid)
            assert (state, threads) == ("T", expect_threads)
            assert sorted(session_tree(forker.pid, threads)[0]) == sorted([forker.pid, *kids])
        finally:
            os.kill(forker.pid, signal.SIGCONT)
