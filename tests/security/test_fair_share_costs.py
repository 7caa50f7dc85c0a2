"""Fair share that counts what a region costs others (hostile neighbours, round two).

``mallory`` runs 4 processes of back-to-back 2 ms regions on one GPU; ``alice``, who has held one
5 s region before (so that fair share by hold seconds alone puts her behind mallory), asks for
the GPU. Before, she waited until mallory stopped (11.3 s in the report): many tiny regions
never add up to one long one, and their own cost (grant, drain, freeze, release) was charged to
no one. Now each region is charged at least its acquire and release, and a user who just had the
GPU goes after the others who wait: alice waits at most one of mallory's regions.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from .helpers_arbiter import Agent, agents, assert_healthy, kill_tree, multi_user_arbiter, read_line, spawn_as
from .users import User

# One of mallory's processes: back-to-back regions of 2 ms on GPU 0 until its stdin closes.
SHORT_REGIONS = r"""
s = Session(gpu=0, endpoint=ENDPOINT, name="short")
out(ready=True)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
n = 0
while not stop.is_set():
    with Exclusive(session=s, gpu=0, max_hold=30):
        time.sleep(0.002)
    n += 1
out(regions=n)
"""


def test_short_regions_of_one_user_do_not_starve_another(alice: User, mallory: User) -> None:
    with multi_user_arbiter() as arb, agents() as made:
        a = Agent(alice, arb)
        made.append(a)
        assert a.call("register", tag="a", gpu=0)["ok"]
        # alice's earlier work: one 5 s region
        a.call("acquire", tag="long", session="a", opts={"gpu": 0, "max_hold": 30})
        assert a.event("granted|acquire_failed", "long")["event"] == "granted"
        time.sleep(5)
        assert a.call("release", tag="long")["ok"]
        loops = [spawn_as(mallory, arb, SHORT_REGIONS) for _ in range(4)]
        waits: list[float] = []
        try:
            for loop in loops:
                assert read_line(loop, timeout=60)["ready"]
            time.sleep(1.0)  # mallory's four loops keep a request of hers always queued
            for i in range(5):
                t0 = time.monotonic()
                a.call("acquire", tag=f"r{i}", session="a", opts={"gpu": 0, "max_hold": 30})
                granted = a.event("granted|acquire_failed", f"r{i}", timeout=15)
                waits.append(time.monotonic() - t0)
                assert granted["event"] == "granted", granted
                assert a.call("release", tag=f"r{i}")["ok"]
                time.sleep(0.2)
            status = subprocess.run(
                [sys.executable, "-m", "krex_lab.cli", "status"], env=arb.env(), capture_output=True, text=True
            ).stdout
        finally:
            counts = []
            for loop in loops:
                if loop.poll() is None and loop.stdin is not None:
                    loop.stdin.write(b"\n")
                    loop.stdin.flush()
            for loop in loops:
                try:
                    counts.append(read_line(loop, timeout=10)["regions"])
                except AssertionError:
                    pass
                kill_tree(loop.pid)
                loop.wait(10)
        print(
            f"alice's waits behind mallory's 4 loops of 2 ms regions ({sum(counts)} regions): "
            f"{', '.join(f'{w * 1e3:.0f}' for w in waits)} ms (median {statistics.median(waits) * 1e3:.0f} ms)"
        )
        print(status)
        assert max(waits) <= 0.5, waits
        # krex status says what fair share charges each user
        assert "fair share" in status and alice.name in status and mallory.name in status, status
        assert_healthy(arb, {alice.uid, mallory.uid})
