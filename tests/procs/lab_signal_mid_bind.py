"""Fault injection: a stop signal that lands while the Jupyter server is binding its socket.

python -m tests.procs.lab_signal_mid_bind SIGNAL ENDPOINT PORT

Runs a jupyter_server with the KREX extension (``stop_on_interrupt``, as ``krex lab`` sets it) on
the arbiter at ENDPOINT and sends itself SIGNAL from inside tornado's ``add_accept_handler``: the
moment the server's first loop callback is half-way through adding the listening socket (seen in
CI, where a SIGTERM right after "is running at" ended in ``KeyError`` and a traceback). The
signal is real; only its timing is arranged. Prints "stopped" once ``start()`` returns.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import tornado.tcpserver
from jupyter_server.serverapp import ServerApp


def main() -> None:
    signame, endpoint, port = sys.argv[1:4]
    real = tornado.tcpserver.add_accept_handler
    fired: list[bool] = []

    def add_accept_handler(*args: Any, **kwargs: Any) -> Any:
        if not fired:
            fired.append(True)
            os.kill(os.getpid(), getattr(signal, signame))  # handled at the next bytecode, mid-bind
        return real(*args, **kwargs)

    tornado.tcpserver.add_accept_handler = add_accept_handler  # type: ignore[assignment]
    app = ServerApp()
    app.initialize(
        [
            f"--port={port}",
            "--ServerApp.token=",
            "--allow-root",
            "--ServerApp.open_browser=False",
            "--ServerApp.jpserver_extensions={'krex_lab.serverext': True}",
            f"--KrexExtensionApp.endpoint={endpoint}",
            "--KrexExtensionApp.start_pool=False",
            "--KrexExtensionApp.watch_interval=0",
            "--KrexExtensionApp.stop_on_interrupt=True",
        ]
    )
    app.start()
    print("stopped", "fired" if fired else "not-fired", flush=True)


if __name__ == "__main__":
    main()
