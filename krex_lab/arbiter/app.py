"""``krex arbiter``: the arbiter as a traitlets Application (options on the command line or in
a config file, ``krex_arbiter_config.py``/``.json``, searched in the current directory and the
Jupyter config path, or named with ``--config``)."""

from __future__ import annotations

import asyncio
import logging

from .. import __version__
from ..application import KrexApplication
from .quotas import Quotas
from .server import Arbiter


class ArbiterApp(KrexApplication):
    name = "krex-arbiter"
    description = "The KREX node arbiter: region-granular GPU exclusivity for every session on this node."
    version = __version__
    classes = [Arbiter, Quotas]

    config_basename = "krex_arbiter_config"

    # aliases and flags are also ``krex arbiter``'s argparse options (KrexApplication.add_arguments)
    aliases = {
        "backend": "Arbiter.backend_name",
        "fake-gpus": "Arbiter.fake_gpus",
        "max-hold": "Arbiter.max_hold",
        "endpoint": "Arbiter.endpoint",
        "runtime-dir": "Arbiter.runtime_dir",
        "isolate-cores": "Arbiter.isolate_cores",
        "drain-timeout": "Arbiter.drain_timeout",
        "config": "ArbiterApp.config_file",
        "cgroups": "Arbiter.cgroups",
        "history-db": "Arbiter.history_db",
        "metrics-port": "Arbiter.metrics_port",
        "log-level": "Application.log_level",
    }
    flags = {
        "multi-user": ({"Arbiter": {"multi_user": True}}, "Serve every user of the node (run as root)."),
        "no-guardian": ({"Arbiter": {"guardian": False}}, "Do not start the guardian (tests only)."),
        "no-lock-foreign": ({"Arbiter": {"lock_foreign": False}}, "Lock only KREX sessions' GPU processes."),
        "debug": ({"Application": {"log_level": logging.DEBUG}}, "Log debug messages."),
    }

    def start(self) -> None:
        arbiter = Arbiter(parent=self)
        asyncio.run(arbiter.serve())


def main(argv: list[str] | None = None) -> None:
    ArbiterApp.launch_instance(argv)
