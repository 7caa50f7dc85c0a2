"""The world an agent study runs in: a ``krex arbiter`` (unless one is given) and a ``krex pool`` of
warm workers, started and stopped by :class:`World`; the pool's log tells which workers it
recycled and why (:meth:`World.recycled`)."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/: common
from common import REPO, wait_until  # noqa: E402


class World:
    """The arbiter (unless given) and the pool this study runs against."""

    def __init__(self, args: argparse.Namespace, runtime: Path) -> None:
        self.args = args
        self.runtime = runtime
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pool_log = runtime / "pool.log"  # the pool's log, read from _log_at on by recycled()
        self._log_at = 0
        env = dict(os.environ)
        if not args.use_arbiter:
            env["KREX_RUNTIME_DIR"] = str(runtime)
            env["KREX_ENDPOINT"] = f"ipc://{runtime}/arbiter.sock"
        env["KREX_POOL_ENDPOINT"] = f"ipc://{runtime}/pool.sock"
        env["KREX_WAIT_NOTICE"] = "0"  # queueing is what is measured: no lines, no status polling
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO), str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH")])
        )
        if args.backend == "fake":
            env["NUMBA_ENABLE_CUDASIM"] = "1"
        self.env = env

    def start_arbiter(self) -> None:
        if self.args.use_arbiter:
            return
        cmd = [sys.executable, "-m", "krex_lab.cli", "arbiter", "--backend", self.args.backend]
        if self.args.backend == "fake":
            cmd += ["--fake-gpus", str(self.args.gpus)]
        self.procs.append(subprocess.Popen(cmd, env=self.env, stderr=subprocess.DEVNULL))
        from krex_lab import client

        def up() -> bool:
            try:
                client.hello(self.env["KREX_ENDPOINT"], timeout=0.5)
                return True
            except Exception:
                return False

        wait_until(up, 30, "the arbiter did not answer")

    def start_pool(self, workers: int, preload: list[str], wait_all: bool = True) -> float:
        """Seconds until ``workers`` per GPU are ready (``wait_all``), else until the pool answers: a
        thread then notes when the first and the last worker came up (``first_worker_s``,
        ``all_ready_s``), busy or idle, while the caller's work already runs on them."""
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "krex_lab.workers.pool", f"--workers-per-gpu={workers}", "--spares=0"]
        cmd += [f"--preload={preload!r}", "--log-level=INFO"]  # INFO: each recycled worker and why
        cmd += [f"--Pool.max_workers_per_gpu={max(8, workers)}"]
        if getattr(self.args, "pool_start_concurrency", None):
            cmd += [f"--Pool.start_concurrency={self.args.pool_start_concurrency}"]
        if self.args.pool_memory_slack_mb is not None:
            cmd += [f"--Pool.memory_slack_mb={self.args.pool_memory_slack_mb}"]
        with open(self.pool_log, "wb") as log:
            self.procs.append(subprocess.Popen(cmd, env=self.env, stderr=log))
        os.environ.update({k: self.env[k] for k in ("KREX_POOL_ENDPOINT",)})
        from krex_lab.workers.client.pool_client import PoolClient

        #: seconds from the pool's start to its first worker ready (a batch may begin there)
        self.first_worker_s: float | None = None

        def ready() -> bool:
            try:
                with PoolClient.connect(self.env["KREX_POOL_ENDPOINT"], start=False) as c:
                    st = c.status()
            except Exception:
                return False
            idle = [w for g in st.gpus for w in g.workers if w.state == "idle"]
            if idle and self.first_worker_s is None:
                self.first_worker_s = time.monotonic() - t0
            return len(idle) >= workers * self.args.gpus

        if wait_all:
            wait_until(ready, 120, f"{workers} warm workers per GPU were not ready")
            self.all_ready_s: float | None = time.monotonic() - t0
            return self.all_ready_s
        self.all_ready_s = None

        def answers() -> bool:
            try:
                with PoolClient.connect(self.env["KREX_POOL_ENDPOINT"], start=False):
                    return True
            except Exception:
                return False

        wait_until(answers, 60, "the pool did not answer")
        answered = time.monotonic() - t0

        def watch() -> None:
            with PoolClient.connect(self.env["KREX_POOL_ENDPOINT"], start=False) as c:
                while self.all_ready_s is None and time.monotonic() - t0 < 300:
                    try:
                        up = [w for g in c.status().gpus for w in g.workers if w.state not in ("starting", "dead")]
                    except Exception:
                        return  # the pool stopped
                    now = time.monotonic() - t0
                    if up and self.first_worker_s is None:
                        self.first_worker_s = now
                    if len(up) >= workers * self.args.gpus:
                        self.all_ready_s = now
                    time.sleep(0.1)

        threading.Thread(target=watch, daemon=True, name="pool-start-watch").start()
        return answered

    def recycled(self) -> dict[str, Any]:
        """Workers the pool recycled since the last call, counted by reason (from its log), and the
        GPU memory (MiB) each reset found left behind where that was the reason."""
        if not self.pool_log.exists():
            return {}
        with open(self.pool_log, errors="replace") as f:
            f.seek(self._log_at)
            text = f.read()
            self._log_at = f.tell()
        reasons: dict[str, Any] = {}
        for line in text.splitlines():
            if "recycling worker" in line:
                why = line.split("): ", 1)[-1].strip()
                left = [float(x) for x in re.findall(r"\+([\d.]+) MiB", why)]
                key = re.sub(r"\+[\d.]+ MiB", "+... MiB", why)[:160]
                reasons[key] = reasons.get(key, 0) + 1
                if left:
                    reasons.setdefault("left_mib", []).extend(left)
        return reasons

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
