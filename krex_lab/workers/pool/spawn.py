"""How the pool starts a context worker: its command, its environment (placed on its GPU) and
its ``Init`` message."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import msgspec

from ... import paths
from ...gpu.vendors import place, placement_variables
from ..wire import Init

#: environment variables that place a worker; a job's environment never overrides them
PLACEMENT = (
    *placement_variables(),
    paths.GPU_ENV,
    paths.ENDPOINT_ENV,
    "KREX_WORKER",
    "KREX_WORKER_REAL",
    "NUMBA_ENABLE_CUDASIM",
)


class NodeBackend(msgspec.Struct, frozen=True):
    """The node's GPU backend as the pool learnt it (the arbiter's ``hello``, else its own look at
    the node): made by ``Pool``, read by :func:`worker_launch` (placement) and the status table."""

    name: str = "unknown"
    simulated: bool = True


#: what a worker process runs (``python -u -m WORKER_MODULE FD``)
WORKER_MODULE = "krex_lab.workers.context"


def worker_launch(
    wid: int,
    gpu: int,
    *,
    python: str,
    worker_env: Mapping[Any, Any],
    backend: NodeBackend,
    gpu_uuids: Mapping[int, str],
    arbiter_endpoint: str,
    arbiter_connected: bool,
    arbiter_pid: int | None,
    preload: list[str],
    ready_hooks: list[str],
    warmup: bool,
    memory_slack_mb: int,
) -> tuple[list[str], dict[str, str], Init]:
    """Command, environment and ``Init`` of worker ``wid`` on ``gpu`` (the pool's ``spawn_args``).

    ``python``: the interpreter ('' for the pool's own); ``worker_env``: extra variables;
    ``backend``: the arbiter's (or the local) backend name and whether it is simulated;
    ``arbiter_connected``/``arbiter_pid``: whether an arbiter answers now, and which (the worker
    registers with it)."""
    real = not backend.simulated
    env = {**os.environ, **{str(k): str(v) for k, v in worker_env.items()}}
    # A pool started inside a region (krex run under krex exclusive) must not make every
    # worker claim it: only a worker started for a region job joins one (Init.within).
    env.pop("KREX_REGION", None)
    env.update(
        {
            paths.GPU_ENV: str(gpu),
            paths.ENDPOINT_ENV: arbiter_endpoint,
            "KREX_WORKER": "1",
            "KREX_WORKER_REAL": "1" if real else "0",
        }
    )
    for var in placement_variables():  # the pool's own placement must not narrow the worker's
        env.pop(var, None)
    env.update(place(backend.name, gpu, gpu_uuids.get(gpu, ""), simulated=not real))
    init = Init(
        gpu=gpu,
        parent=os.getpid(),
        preload=list(preload),
        ready_hooks=list(ready_hooks),
        warmup=warmup,
        real=real,
        memory_slack=memory_slack_mb << 20,
        arbiter=arbiter_endpoint if arbiter_connected else None,
        arbiter_pid=arbiter_pid,
        name=f"pool worker {wid} (GPU {gpu}, pool pid {os.getpid()})",
    )
    return [python or sys.executable, "-u", "-m", WORKER_MODULE], env, init


def import_path() -> str:
    """This process's import path, for a child started without the site module."""
    here = os.getcwd()
    return os.pathsep.join(p for p in sys.path if p and p != here)
