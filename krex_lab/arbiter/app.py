"""``krex arbiter``: the arbiter as a traitlets Application (options on the command line or in
a config file, ``krex_arbiter_config.py``/``.json``, searched in the current directory and the
Jupyter config path, or named with ``--config``)."""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import signal

from traitlets import TraitError, default

from .._version import __version__
from ..application import KrexApplication
from ..errors import KrexError
from ..gpu import FAKE_GPUS
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
    minimums = {"fake-gpus": 1}
    flags = {
        "multi-user": ({"Arbiter": {"multi_user": True}}, "Serve every user of the node (run as root)."),
        "slurm": ({"Arbiter": {"slurm": True}}, "Record each session's Slurm job, step and account."),
        "no-guardian": ({"Arbiter": {"guardian": False}}, "Do not start the guardian (tests only)."),
        "no-lock-foreign": ({"Arbiter": {"lock_foreign": False}}, "Lock only KREX sessions' GPU processes."),
        "guard-neighbours": (
            {"Arbiter": {"guard_neighbours": True}},
            "Hold regions against their neighbours: cpuset shield where possible, an affinity watch, "
            "parents journaled before a SIGSTOP freeze (see Arbiter.guard_neighbours).",
        ),
        "debug": ({"Application": {"log_level": logging.DEBUG}}, "Log debug messages."),
    }

    @default("log_level")
    def _log_level_default(self) -> int:
        return logging.INFO  # the start-up line ("serving on ...") shows without --log-level

    def start(self) -> None:
        # `kill -USR1 <arbiter>` writes every thread's stack to its stderr (the log): what a stalled
        # arbiter is doing, even inside a C call (the test fixture asks for it when one does not answer).
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        try:
            arbiter = Arbiter(parent=self)
        except (ValueError, TraitError, OSError) as exc:  # --Arbiter.fake_gpus=0, an unusable runtime dir, ...
            raise KrexError(str(exc)) from None
        asyncio.run(self._serve(arbiter))

    async def _serve(self, arbiter: Arbiter) -> None:
        # `kill -HUP <arbiter>` reloads the quotas from the config files (a hub's edited
        # jupyterhub_config.py) without a restart, which would end every region and session.
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload_quotas, arbiter)
        ready = asyncio.Event()
        serving = asyncio.ensure_future(arbiter.serve(ready))
        started = asyncio.ensure_future(ready.wait())
        await asyncio.wait([serving, started], return_when=asyncio.FIRST_COMPLETED)
        if started.done():
            log.info("%s", serving_line(arbiter))
        else:
            started.cancel()
        try:
            await serving
        except Exception:
            if started.done():  # a crash after start-up: its traceback in the log, one line on stderr
                log.exception("krex arbiter stopped on an error")
            raise

    def reload_quotas(self, arbiter: Arbiter) -> None:
        """Read the config files and the command line again, as at start, and apply their quotas."""
        source = self.config_file or f"{self.config_basename}.py (config path)"
        probe = type(self)(raise_config_file_errors=True)  # a broken edit must not pass for "no quotas"
        try:
            probe.initialize(list(self.argv))
        except Exception as exc:  # a syntax error in the edited file: say so, keep the quotas
            arbiter.quotas_note = f"reload from {source} failed ({exc}): the earlier quotas stay"
            log.error("quotas: %s", arbiter.quotas_note)
            return
        arbiter.quotas_note = arbiter.quotas.reload_from(probe.config, source)


def serving_line(arbiter: Arbiter) -> str:
    """``krex arbiter serving on ipc://... (2 GPUs, backend nvidia)``; for the fake backend, how
    many GPUs it simulates and why."""
    n = arbiter.gpu_count
    gpus = f"{n} GPU" + ("" if n == 1 else "s")
    # how neighbours are kept off a region's cores, in the same one line
    guard = f"; neighbour guard {'on' if arbiter.guard_neighbours else 'off'}; shield {arbiter.shielding.describe()}"
    if not arbiter.backend.simulated:
        return f"krex arbiter {__version__} serving on {arbiter.bound} ({gpus}, backend {arbiter.backend.name}){guard}"
    why = "no GPU library answered" if arbiter.backend_name == "auto" else f"--backend {arbiter.backend_name}"
    default = " (the default)" if n == FAKE_GPUS else ""
    return (
        f"krex arbiter {__version__} serving on {arbiter.bound} (fake backend: {n} simulated "
        f"GPU{'' if n == 1 else 's'}{default}, because {why}; --fake-gpus N to change){guard}"
    )


log = logging.getLogger("krex.arbiter")


def main(argv: list[str] | None = None) -> None:
    ArbiterApp.launch_instance(argv)
