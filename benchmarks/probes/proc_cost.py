"""What a region's /proc and signal work costs per sibling on this machine.

    python benchmarks/probes/proc_cost.py                  # 15 torch CUDA siblings, 50 rounds
    python benchmarks/probes/proc_cost.py --siblings 15 --rounds 50 --plain

A region with 15 idle CUDA siblings spent 2.6 ms freezing them and 1.4 ms listing them on the
H200 (arbiter_latency.py, 2026-12-02), whose kernel is gVisor: there a /proc read or a signal
costs what it costs, not what it costs on Linux. This script times, for all siblings at once,
each primitive the region sequence is made of, so that a change can be chosen from figures:

* ``tree``: :func:`krex_lab.procutil.tree` of each sibling (a listdir of its tasks and one read of
  each thread's children file, through the descriptors it keeps, :mod:`krex_lab.procfiles`),
  and its parts: ``listdir_task``, ``children_open`` (open, read, close per thread, as tree()
  read before it kept them) and ``children_pread`` (a kept descriptor re-read per thread);
* ``stat``: one stat read per sibling (:func:`state_and_start`); ``stat_pread`` through kept
  descriptors; ``kill0`` and, where pidfds are given, ``pidfd0`` (signal 0 through a pidfd);
* ``stop_land``: SIGSTOP to every sibling and the wait until every stop shows, then SIGCONT;
* ``affinity``: sched_getaffinity and sched_setaffinity (to the same mask) of every thread;
* ``node_walk``: the shield's walk of the node (:func:`krex_lab.enforcement.shield.node_pids`).

Siblings are torch processes with a CUDA tensor (``--plain``: plain ``sleep`` processes, for a
machine without a GPU). The JSON holds p50/p99 of each figure for all siblings together.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import machine, percentile, write_result

from krex_lab.enforcement.shield import node_pids
from krex_lab.procfiles import read_proc
from krex_lab.procutil import open_stat, read_stat, read_state, state_and_start, tree

SIBLING = """
import time, torch
x = torch.randn(1024, 1024, device="cuda"); torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(3600)
"""


def timed(rounds: int, fn: Callable[[], object], after: Callable[[], object] = lambda: None) -> dict[str, float]:
    """p50/p99 of ``fn``'s wall time over ``rounds``; ``after`` runs untimed after each."""
    xs = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t0) * 1e3)
        after()
    return {"p50_ms": round(percentile(xs, 0.5), 4), "p99_ms": round(percentile(xs, 0.99), 4)}


def read_all(fd: int) -> bytes:
    return os.pread(fd, 65536, 0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--siblings", type=int, default=15)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--plain", action="store_true", help="sleep processes instead of torch CUDA ones")
    args = p.parse_args()
    cmd = ["sleep", "3600"] if args.plain else [sys.executable, "-c", SIBLING]
    sibs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(args.siblings)]
    try:
        if not args.plain:
            for s in sibs:
                assert s.stdout is not None and s.stdout.readline().startswith("ready")
        pids = [s.pid for s in sibs]
        tids = {pid: os.listdir(f"/proc/{pid}/task") for pid in pids}
        children_fds = [os.open(f"/proc/{pid}/task/{t}/children", os.O_RDONLY) for pid in pids for t in tids[pid]]
        stat_fds = [fd for fd in (open_stat(pid) for pid in pids) if fd is not None]
        try:
            pidfds = [os.pidfd_open(pid) for pid in pids]
            pidfd_error = ""
        except OSError as exc:
            pidfds, pidfd_error = [], str(exc)

        def stop_land() -> None:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            waiting = list(stat_fds)
            while waiting:
                waiting = [fd for fd in waiting if read_state(fd) not in ("T", "t")]

        def cont() -> None:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
            time.sleep(0.005)  # back asleep before the next round

        def affinity(set_too: bool) -> None:
            for pid in pids:
                for t in tids[pid]:
                    mask = os.sched_getaffinity(int(t))
                    if set_too:
                        os.sched_setaffinity(int(t), mask)

        figures: dict[str, Any] = {
            "tree": timed(args.rounds, lambda: [tree(pid) for pid in pids]),
            "listdir_task": timed(args.rounds, lambda: [os.listdir(f"/proc/{pid}/task") for pid in pids]),
            "children_open": timed(
                args.rounds,
                lambda: [read_proc(f"/proc/{pid}/task/{t}/children", whole=True) for pid in pids for t in tids[pid]],
            ),
            "children_pread": timed(args.rounds, lambda: [read_all(fd) for fd in children_fds]),
            "stat": timed(args.rounds, lambda: [state_and_start(pid) for pid in pids]),
            "stat_pread": timed(args.rounds, lambda: [read_stat(fd) for fd in stat_fds]),
            "kill0": timed(args.rounds, lambda: [os.kill(pid, 0) for pid in pids]),
            "stop_land": timed(args.rounds, stop_land, cont),
            "getaffinity": timed(args.rounds, lambda: affinity(False)),
            "get_set_affinity": timed(args.rounds, lambda: affinity(True)),
            "node_walk": timed(args.rounds, lambda: node_pids(set())),
        }
        if pidfds:
            figures["pidfd0"] = timed(args.rounds, lambda: [signal.pidfd_send_signal(fd, 0) for fd in pidfds])
        threads = sum(len(v) for v in tids.values())
        print(f"{args.siblings} siblings, {threads} threads; pidfds: {pidfd_error or 'yes'}")
        for name, f in figures.items():
            print(f"  {name:18s} p50 {f['p50_ms']:.3f} ms  p99 {f['p99_ms']:.3f} ms")
    finally:
        for s in sibs:
            s.kill()
            s.wait()
    write_result(
        "proc_cost" + ("-plain" if args.plain else ""),
        {
            "benchmark": "proc_cost",
            "machine": machine(),
            "command": " ".join(sys.argv),
            "siblings": args.siblings,
            "threads": threads,
            "pidfds": pidfd_error or "yes",
            "figures": figures,
        },
    )


if __name__ == "__main__":
    main()
