"""jupyter_server's websocket keep-alive against tornado >= 6.5: a false warning at every start.

jupyter_server's ``WebSocketMixin`` pings every ``ws_ping_interval`` ms (30000) and closes a socket
whose pong is ``ws_ping_timeout`` ms late (90000). It does so itself, but its ``ping_interval`` and
``ping_timeout`` properties also reach tornado, which reads them as seconds and, since 6.5, refuses
a timeout longer than the interval: "The websocket_ping_timeout (90000) cannot be longer than the
websocket_ping_interval (30000)", once per server. Tornado's clamp only touches tornado's own ping
loop, which these numbers put 8 hours apart; the pings that keep a kernel's socket alive are
jupyter_server's, unchanged. No setting satisfies both (jupyter_server needs the timeout above the
interval, tornado below it; a zero interval turns both off), so the server drops that one line,
and only while the numbers are jupyter_server's own settings.
"""

from __future__ import annotations

import logging
import re
from typing import Any

_CLAMP = re.compile(r"The websocket_ping_timeout \((\d+)\) cannot be longer than the websocket_ping_interval \((\d+)\)")


class _JupyterPingClamp(logging.Filter):
    def __init__(self, settings: dict[str, Any]) -> None:
        super().__init__()
        self.settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        found = _CLAMP.match(record.getMessage())
        if found is None:
            return True
        from jupyter_server.base.websocket import WS_PING_INTERVAL

        interval = self.settings.get("ws_ping_interval", WS_PING_INTERVAL)
        timeout = self.settings.get("ws_ping_timeout", max(3 * interval, WS_PING_INTERVAL))
        return (int(found.group(1)), int(found.group(2))) != (timeout, interval)


def drop_the_false_ping_warning(web_settings: dict[str, Any]) -> None:
    """Filter tornado's warning about jupyter_server's own ping settings (``web_settings``: the
    server's tornado settings, read when the warning comes)."""
    log = logging.getLogger("tornado.general")
    if not any(isinstance(f, _JupyterPingClamp) for f in log.filters):
        log.addFilter(_JupyterPingClamp(web_settings))
