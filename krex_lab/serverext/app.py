"""``KrexExtensionApp``: the KREX Jupyter server extension.

Loaded through ``krex_lab.serverext._jupyter_server_extension_points`` (enabled by
``etc/jupyter/jupyter_server_config.d/krex_lab.json``, installed as wheel shared-data). At
start it connects to the arbiter (an explicit endpoint, else the node's root arbiter at
``node_endpoint`` when one answers, else this user's) or starts an embedded one, starts this user's pool service,
exports ``KREX_ENDPOINT``/``KREX_POOL_ENDPOINT`` for the kernels it will launch (the ``krex``
kernelspec's provisioner places each kernel on a GPU), and serves the REST and Prometheus
handlers. At stop it ends everything it started (:mod:`krex_lab.serverext.processes`).

With ``stop_on_interrupt`` (what ``krex lab`` sets) one SIGINT stops the server as SIGTERM does:
jupyter_server's own handling asks for confirmation on a terminal, and without one lets
KeyboardInterrupt end its loop before any cleanup (its ``jpserver-*`` files, this extension's
arbiter and pool and their sockets would stay behind). Both signals then only *schedule* the stop
on the server's loop: jupyter_server's handler stops the HTTP server inside the signal handler,
which a signal that lands while tornado is still adding the listening socket (the bind runs as the
loop's first callback, after "is running at" is printed) turns into ``KeyError`` and a traceback.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from tornado.ioloop import PeriodicCallback
from traitlets import Bool, Float, Int, List, Unicode, default

from .._version import __version__
from ..gpu import FAKE_GPUS
from ..gpu.traits import BackendName
from . import arbiter_kind, handlers
from .metrics import RegionStats
from .processes import Options, Services


class KrexExtensionApp(ExtensionApp):
    name = "krex_lab"
    description = "KREX Lab: region-granular GPU exclusivity for notebook kernels"
    version = __version__
    load_other_extensions = True

    endpoint = Unicode(
        "",
        config=True,
        help="The arbiter's endpoint (ipc://PATH or tcp://HOST:PORT). Default: "
        "$KREX_ENDPOINT, else the ipc socket in this user's KREX runtime dir.",
    )
    node_endpoint = Unicode(
        config=True,
        help="The node's root arbiter (a JupyterHub node): used when it answers there and no "
        "endpoint is given explicitly (`endpoint`, $KREX_ENDPOINT). Default: $KREX_NODE_ENDPOINT, "
        "else ipc:///run/krex/arbiter.sock; empty: never look for one.",
    )

    @default("node_endpoint")
    def _node_endpoint_default(self) -> str:
        return os.environ.get(arbiter_kind.NODE_ENDPOINT_ENV, arbiter_kind.NODE_ENDPOINT)

    embedded = Bool(
        True,
        config=True,
        help="Start an embedded arbiter (ended with the server) when none "
        "answers at the endpoint: the single-user default.",
    )
    backend = BackendName(
        "auto",
        config=True,
        help="GPU backend of the embedded "
        "arbiter: auto tries nvidia, then amd, then the simulated fake backend (announced).",
    )
    fake_gpus = Int(
        FAKE_GPUS, config=True, help="Number of simulated GPUs when the embedded arbiter uses the fake backend."
    )
    runtime_dir = Unicode(
        "",
        config=True,
        help="KREX runtime dir of the embedded arbiter and the pool "
        "(default: $KREX_RUNTIME_DIR, else $XDG_RUNTIME_DIR/krex or /tmp/krex-UID).",
    )
    arbiter_args = List(
        Unicode(), config=True, help="Extra command-line options of the embedded arbiter (`krex arbiter --help-all`)."
    )
    start_pool = Bool(
        True,
        config=True,
        help="Start this user's pool service (context workers for %%krex cells); it is stopped with the server.",
    )
    pool_size = Int(
        1,
        config=True,
        help="Active context workers per GPU in the pool (it also keeps warm "
        "spares: see pool_args and `python -m krex_lab.workers.pool --help-all`).",
    )
    pool_endpoint = Unicode(
        "", config=True, help="The pool's endpoint. Default: $KREX_POOL_ENDPOINT, else ipc://<runtime dir>/pool.sock."
    )
    pool_args = List(Unicode(), config=True, help="Extra command-line options of the pool service.")
    startup_timeout = Float(
        20.0, config=True, help="Seconds to wait for the embedded arbiter or the pool to answer at start."
    )
    stop_timeout = Float(
        10.0,
        config=True,
        help="Seconds the arbiter and the pool get to exit after SIGTERM before they (and what they left) are killed.",
    )
    watch_interval = Float(
        5.0,
        config=True,
        help="Seconds between checks that the embedded arbiter and "
        "the pool still run (a dead one is started again); 0 disables.",
    )

    stop_on_interrupt = Bool(
        False,
        config=True,
        help="One SIGINT (Ctrl-C) stops the server cleanly, as SIGTERM does, without jupyter_server's "
        "confirmation prompt (`krex lab` sets it).",
    )

    services: Services
    region_stats: RegionStats
    _watch: PeriodicCallback | None = None

    def initialize_settings(self) -> None:
        pool_args = [f"--workers-per-gpu={self.pool_size}", *self.pool_args]
        options = Options(
            endpoint=self.endpoint,
            node_endpoint=self.node_endpoint,
            embedded=self.embedded,
            backend=self.backend,
            fake_gpus=self.fake_gpus,
            runtime_dir=self.runtime_dir,
            arbiter_args=list(self.arbiter_args),
            start_pool=self.start_pool,
            pool_endpoint=self.pool_endpoint,
            pool_args=pool_args,
            startup_timeout=self.startup_timeout,
            stop_timeout=self.stop_timeout,
        )
        self.services = Services(options, logger=self.log)
        self.services.start()
        self._keep_shipped_notebooks_clean()
        self._drop_the_false_ping_warning()
        self.region_stats = RegionStats()
        self.settings.update(handlers.handler_settings(self.services, self.region_stats))
        if self.stop_on_interrupt:
            self._stop_on_interrupt()

    def _keep_shipped_notebooks_clean(self) -> None:
        """Save this checkout's shipped notebooks without outputs: running them leaves git clean; and
        read them as the kernel will describe itself, so that opening one does not mark it modified."""
        from ..shipped_notebooks import fill_on_read, pre_save_hook

        manager = getattr(self.serverapp, "contents_manager", None)
        register = getattr(manager, "register_pre_save_hook", None)
        if callable(register):
            register(pre_save_hook)
            fill_on_read(manager)

    def _drop_the_false_ping_warning(self) -> None:
        from .ws_ping import drop_the_false_ping_warning

        web_app = getattr(self.serverapp, "web_app", None)
        if web_app is not None:
            drop_the_false_ping_warning(web_app.settings)

    def _stop_on_interrupt(self) -> None:
        """SIGINT and SIGTERM stop the server, from its loop (after jupyter_server installed its handlers)."""
        server = self.serverapp
        if server is None or threading.current_thread() is not threading.main_thread():
            self.log.warning("KREX: cannot make Ctrl-C stop this server at once (jupyter_server changed?)")
            return

        def stop_soon(signum: int, _frame: Any) -> None:
            loop = getattr(server, "io_loop", None)
            if loop is None:  # before the loop exists there is nothing to interrupt
                server.stop(from_signal=True)
                return
            server.log.critical("received signal %s, stopping", signal.Signals(signum).name)
            # Runs after the loop's pending callbacks (the socket bind among them).
            loop.asyncio_loop.call_soon_threadsafe(server.stop)

        signal.signal(signal.SIGINT, stop_soon)
        signal.signal(signal.SIGTERM, stop_soon)
        atexit.register(self._say_stopped)

    def _say_stopped(self) -> None:
        """The process's last line, once the server stopped: what it stopped, what (if anything) remains."""
        if not self.services.stopped:
            return
        left = [str(p) for p in self.services.leftovers()]
        info = getattr(self.serverapp, "info_file", "")
        left += [f for f in (info, getattr(self.serverapp, "browser_open_file", "")) if f and os.path.exists(f)]
        self.log.info(
            "KREX: stopped: the Jupyter server, %s%s",
            self.services.stopped_description(),
            f"; left behind: {', '.join(left)}" if left else "; no socket or server file left behind",
        )

    def initialize_handlers(self) -> None:
        self.handlers.extend(handlers.default_handlers)

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        if self.watch_interval > 0:
            self._watch = PeriodicCallback(self.services.check, self.watch_interval * 1000)
            self._watch.start()

    async def stop_extension(self) -> None:
        if self._watch is not None:
            self._watch.stop()
        await self.services.stop()
