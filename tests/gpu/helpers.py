"""What the GPU tests share besides conftest.py's marker handling: an arbiter and pool on the
NVIDIA backend."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from krex_lab.pytest_plugin import wait_for
from tests.support import ROOT
from tests.support.pool import PoolProc


def nvidia_pool(tmp_path_factory: pytest.TempPathFactory, *pool_args: str) -> Iterator[PoolProc]:
    """An arbiter on the NVIDIA backend and a pool serving GPU 0 (``pool_args`` added), on a private
    runtime dir that this process uses meanwhile (``KREX_EVAL_CACHE`` inside it); stopped after."""
    runtime = tmp_path_factory.mktemp("rt")
    os.chmod(runtime, 0o700)
    endpoint = f"ipc://{runtime / 'arbiter.sock'}"
    env = {
        **os.environ,
        "KREX_RUNTIME_DIR": str(runtime),
        "KREX_ENDPOINT": endpoint,
        "KREX_EVAL_CACHE": str(runtime / "cache"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
    }
    with open(runtime / "arbiter.log", "wb") as log:
        arbiter = subprocess.Popen(
            [sys.executable, "-m", "krex_lab.cli", "arbiter", "--backend", "nvidia"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    wait_for(lambda: Path(runtime / "arbiter.sock").exists(), timeout=30)
    pool = PoolProc(env, f"ipc://{runtime / 'pool.sock'}", *pool_args, "--Pool.gpus=0", log=runtime / "pool.log")
    with pytest.MonkeyPatch.context() as mp:
        for key in ("KREX_RUNTIME_DIR", "KREX_ENDPOINT", "KREX_EVAL_CACHE"):
            mp.setenv(key, env[key])
        try:
            pool.start(timeout=180)
            yield pool
        finally:
            pool.stop()
            arbiter.send_signal(signal.SIGTERM)
            arbiter.wait(20)
