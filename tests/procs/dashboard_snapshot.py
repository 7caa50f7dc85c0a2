"""The dashboard during a region, as a standalone HTML page (and, where Chromium is, a screenshot of it).

    python -m tests.procs.dashboard_snapshot run OUT_DIR [--backend fake|nvidia] [--work sleep|torch]
    python -m tests.procs.dashboard_snapshot shot PAGE.html OUT.png

``run`` starts a private arbiter (telemetry every 0.5 s), an idle neighbour session, a session
that takes regions in a loop (``--work torch``: matrix products on the GPU inside each region,
its neighbour holding GPU memory) and a waiter, opens a dashboard on that arbiter (its feed, not
a browser), waits until a region is held (on a real GPU: with utilisation above 0), and writes
``dashboard.html`` (:meth:`Dashboard.to_html`: the panels' HTML and SVG, bars drawn as boxes),
``dashboard.txt`` (the summary and the widgets' values) into OUT_DIR. ``shot`` renders such a page
in headless Chromium (for a page made on a machine without a browser, such as the GPU machine).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent

NEIGHBOUR = """
import sys, time, krex_lab
krex_lab.attach(gpu=int(sys.argv[1]), name="idle-neighbour")
if sys.argv[2] == "torch":
    import torch
    keep = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")  # 2 GiB on the GPU, shown as its memory
print("ready", flush=True)
time.sleep(600)
"""

LOOP = """
import sys, time, krex_lab
from krex_lab.client import Exclusive
gpu, home, name, work, hold = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5])
session = krex_lab.attach(gpu=home, name=name)
if work == "torch":
    import torch
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("ready", flush=True)
while True:
    with Exclusive(gpu=gpu, max_hold=30, session=session):
        end = time.time() + hold
        while time.time() < end:
            if work == "torch":
                for _ in range(20):
                    a @ a
                torch.cuda.synchronize()
            else:
                time.sleep(0.05)
    time.sleep(0.2)
"""


def run(out: Path, backend: str, work: str, timeout: float) -> int:
    from krex_lab.client import hello
    from krex_lab.dashboard.view import Dashboard
    from krex_lab.errors import KrexError

    out.mkdir(parents=True, exist_ok=True)
    runtime = tempfile.mkdtemp(prefix="krex-snap-")
    endpoint = f"ipc://{runtime}/arbiter.sock"
    env = {
        **os.environ,
        "KREX_RUNTIME_DIR": runtime,
        "KREX_ENDPOINT": endpoint,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.pop("KREX_GPU", None)
    procs: list[subprocess.Popen[bytes]] = []
    log = open(out / "arbiter.log", "wb")  # noqa: SIM115 - closed below
    procs.append(
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "krex_lab.cli",
                "arbiter",
                "--backend",
                backend,
                "--fake-gpus",
                "2",
                "--Arbiter.telemetry_interval=0.5",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    )
    dash: Any = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                gpus = int(hello(endpoint, timeout=1.0)["gpus"])
                break
            except KrexError:
                if time.monotonic() > deadline or procs[0].poll() is not None:
                    print((out / "arbiter.log").read_text(), file=sys.stderr)
                    return 1
                time.sleep(0.1)
        target, home = 0, (1 if gpus > 1 else 0)

        def start(code: str, *args: str) -> None:
            p = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE)
            procs.append(p)
            assert p.stdout is not None and p.stdout.readline().startswith(b"ready"), f"{args} did not start"

        start(NEIGHBOUR, str(target), work)
        start(LOOP, str(target), str(target), "region-loop-a", work, "2.0")
        start(LOOP, str(target), str(home), "region-loop-b", work, "1.0")
        dash = Dashboard(endpoint=endpoint, refresh=0.25)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            g = dash.state.gpu(target)
            busy = g is not None and g.holder is not None and time.time() - g.holder.since > 0.5
            if busy and g is not None and len(g.regions) >= 2 and (backend == "fake" or (g.utilization or 0) > 0):
                break
            time.sleep(0.1)
        else:
            print(f"no region with readings within {timeout} s:\n{dash.summary()}", file=sys.stderr)
            return 1
        dash.render()
        (out / "dashboard.html").write_text(dash.to_html())
        p = dash.panels[target]
        values = {
            "header": dash.header.value,
            "util": p.util_bar.value,
            "memory": [p.memory_bar.value, p.memory_bar.max],
            "clock": p.clock.value,
            "holder": p.holder.value,
            "queue": p.queue.value,
            "sessions": p.sessions.value,
            "telemetry_seq": dash.state.telemetry_seq,
        }
        (out / "dashboard.txt").write_text(dash.summary() + "\n\n" + json.dumps(values, indent=1) + "\n")
        print(dash.summary())
        return 0
    finally:
        if dash is not None:
            dash.close()
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        log.close()
        shutil.rmtree(runtime, ignore_errors=True)  # its sockets and journal; the logs are in `out`


def shot(page: Path, png: Path) -> int:
    from playwright.sync_api import sync_playwright

    from tests.support.browser import CHROMIUM_FLAGS, find_chromium

    chromium = find_chromium()
    if chromium is None:
        print("no Chromium found", file=sys.stderr)
        return 1
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            tempfile.mkdtemp(prefix="krex-chromium-"),
            executable_path=chromium,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1100, "height": 700},
        )
        try:
            tab = ctx.pages[0] if ctx.pages else ctx.new_page()
            tab.goto(page.resolve().as_uri())
            tab.screenshot(path=str(png), full_page=True)
        finally:
            ctx.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("out", type=Path)
    p.add_argument("--backend", default="fake", choices=["fake", "nvidia"])
    p.add_argument("--work", default="sleep", choices=["sleep", "torch"])
    p.add_argument("--timeout", type=float, default=60.0)
    p = sub.add_parser("shot")
    p.add_argument("page", type=Path)
    p.add_argument("png", type=Path)
    args = parser.parse_args()
    if args.cmd == "run":
        return run(args.out, args.backend, args.work, args.timeout)
    return shot(args.page, args.png)


if __name__ == "__main__":
    sys.exit(main())
