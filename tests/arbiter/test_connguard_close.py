"""The connection guard lets its server stop while connections are still going away.

A socket monitor reports each disconnect on an inproc PAIR socket that the guard's thread reads;
a monitor's send blocks for good once that reader has closed. The guard used to stop its thread
first and disable the monitors after: an arbiter whose sessions all left at once (the end of
benchmarks/regions/scale.py, 512 of them) hung in ``disable_monitor`` and never stopped on SIGTERM.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import ROOT

CLOSE_DURING_DISCONNECTS = """
import sys, threading, time, zmq
from krex_lab.connguard import ConnectionGuard, ConnectionLimits
for round in range(int(sys.argv[2])):
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    guard = ConnectionGuard("test", ctx, ConnectionLimits())
    guard.watch(router, "main")
    router.bind(f"ipc://{sys.argv[1]}/guard{round}.sock")
    guard.start()
    clients = []
    for _ in range(200):
        c = ctx.socket(zmq.DEALER)
        c.setsockopt(zmq.LINGER, 0)
        c.connect(f"ipc://{sys.argv[1]}/guard{round}.sock")
        c.send(b"hello")
        clients.append(c)
    while guard.counts()["main"] < 200:
        time.sleep(0.01)
    def leave():  # every client goes at once, as a node's sessions do when their job ends
        for c in clients:
            c.close()
    leaving = threading.Thread(target=leave)
    leaving.start()
    guard.close()
    leaving.join()
    router.close(0)
    ctx.term()
print("closed", flush=True)
"""


def test_the_guard_closes_while_its_connections_go_away(tmp_path: Path) -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", CLOSE_DURING_DISCONNECTS, str(tmp_path), "10"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError("the guard's close hung while connections were going away") from None
    assert done.returncode == 0 and "closed" in done.stdout, done.stderr[-3000:]
