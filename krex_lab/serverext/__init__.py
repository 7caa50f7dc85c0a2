"""The KREX Jupyter server extension (``jpserver_extensions: {"krex_lab.serverext": true}``).

See :mod:`krex_lab.serverext.app` for the extension and its options,
:mod:`~krex_lab.serverext.handlers` for the REST/Prometheus endpoints and
:mod:`~krex_lab.serverext.processes` for the embedded arbiter and the pool service.
"""

from __future__ import annotations

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from .app import KrexExtensionApp

    return [{"module": "krex_lab.serverext", "app": KrexExtensionApp}]
