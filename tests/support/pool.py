"""Helpers for the pool tests: a real pool process next to a real arbiter (fake backend)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from krex_lab.workers.client import PoolClient
from krex_lab.workers.wire import PoolTable
from tests.support import ROOT


class PoolProc:
    def __init__(self, env: dict[str, str], endpoint: str, *args: str, log: Path) -> None:
        self.env = {**env, "KREX_POOL_ENDPOINT": endpoint}
        self.endpoint = endpoint
        self.args = args
        self.log_path = log
        self.proc: subprocess.Popen[bytes] | None = None
        self._client: PoolClient | None = None

    def start(self, timeout: float = 60) -> PoolProc:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "krex_lab.workers.pool", f"--endpoint={self.endpoint}", *self.args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._client = PoolClient.connect(self.endpoint, start=False)
                break
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"pool did not start:\n{self.log()}") from None
                time.sleep(0.05)
        self.wait_ready(timeout)
        return self

    @property
    def client(self) -> PoolClient:
        assert self._client is not None
        return self._client

    def status(self) -> PoolTable:
        return self.client.status()

    def wait_ready(self, timeout: float = 30) -> PoolTable:
        """Until every GPU has its full complement of workers, none starting."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            if status.ready and not status.running and not status.queue:
                return status
            if time.monotonic() > deadline:
                raise AssertionError(f"pool not back to full size within {timeout} s: {status}\n{self.log()}")
            time.sleep(0.05)

    def worker_pids(self, gpu: int | None = None, status: PoolTable | None = None) -> list[int]:
        status = status or self.status()
        return [
            w.pid
            for g in status.gpus
            if gpu is None or g.index == gpu
            for w in g.workers
            if w.state != "dead" and w.pid is not None
        ]

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                for p in psutil.Process(self.proc.pid).children(recursive=True):
                    p.kill()
                self.proc.kill()
                self.proc.wait()


def krex_run(
    env: dict[str, str], *args: str, cwd: str | Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``krex run ARGS`` with no stdin (/dev/null): a CI runner's stdin may be a pipe it holds open,
    which krex run would say it did not forward."""
    return subprocess.run(
        [sys.executable, "-m", "krex_lab.cli", "run", *args],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def python_run(
    env: dict[str, str], *args: str, cwd: str | Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def shell_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
