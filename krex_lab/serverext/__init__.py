"""The KREX Jupyter server extension (``jpserver_extensions: {"krex_lab.serverext": true}``).

See :mod:`krex_lab.serverext.app` for the extension and its options,
:mod:`~krex_lab.serverext.handlers` for the REST/Prometheus endpoints and
:mod:`~krex_lab.serverext.processes` for the embedded arbiter and the pool service.
"""

from __future__ import annotations

from typing import TypedDict


class ExtensionPoint(TypedDict):
    """What jupyter_server asks of an extension package: its module and its app class."""

    module: str
    app: type


def _jupyter_server_extension_points() -> list[ExtensionPoint]:
    from .app import KrexExtensionApp

    return [ExtensionPoint(module="krex_lab.serverext", app=KrexExtensionApp)]
