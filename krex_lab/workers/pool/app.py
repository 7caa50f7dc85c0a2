"""``krex pool`` / ``python -m krex_lab.workers.pool``: the pool's application (its command line,
its configuration file, its log levels) around the :class:`~.service.Pool` service."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from ..._version import __version__
from ...application import KrexApplication
from ...errors import KrexError
from .service import Pool, log, serving_log

__all__ = ["PoolApp", "main"]


class PoolApp(KrexApplication):
    name = "krex-pool"
    description = "This user's KREX pool of warm context workers (krex run, %%krex, krex_lab.submit)."
    version = __version__
    classes = [Pool]
    config_basename = "krex_pool_config"
    aliases = {
        "endpoint": "Pool.endpoint",
        "arbiter": "Pool.arbiter",
        "workers-per-gpu": "Pool.workers_per_gpu",
        "spares": "Pool.spares_per_gpu",
        "preload": "Pool.preload",
        "job-timeout": "Pool.job_timeout",
        "idle-exit": "Pool.idle_exit",
        "config": "PoolApp.config_file",
        "log-level": "Application.log_level",
    }
    flags = {
        "on-demand": ({"Pool": {"on_demand": True}}, "Started by a client: exit when idle (on_demand_idle_exit)."),
        "step-aside": ({"Pool": {"step_aside": True}}, "Exit 0 quietly if another pool already serves the endpoint."),
        "no-preload": ({"Pool": {"preload": []}}, "Preload no framework."),
        "debug": ({"Application": {"log_level": logging.DEBUG}}, "Log debug messages."),
    }

    def initialize(self, argv: Any = None) -> None:
        super().initialize(argv)
        level = int(self.log_level)  # type: ignore[call-overload]
        if level <= logging.WARNING:  # the start-up line ("serving on ...") shows without --log-level
            serving_log.setLevel(min(level, logging.INFO))

    def start(self) -> None:
        pool = Pool(parent=self)
        try:
            code = asyncio.run(pool.serve())
        except KrexError as exc:
            log.error("%s", exc)
            code = 1
        sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    PoolApp.launch_instance(argv)
