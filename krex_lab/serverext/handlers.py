"""REST and Prometheus handlers, all authenticated and authorised, under the server's base_url.

``/krex/api/status``    the node's table (as ``krex status --json``) plus this server's services
``/krex/api/sessions``  every registered session, flattened, with the GPU it is placed on
``/krex/api/regions``   recent regions with their reports (``?limit=N``, newest last)
``/krex/metrics``       Prometheus text format (send the token: ``Authorization: token …``)
``/krex/api/spec.json`` the OpenAPI document of these routes (:mod:`.openapi`)

The arbiter is reached with the blocking client (ZeroMQ with timeouts), always in a thread of
the executor, never on the tornado loop. What the handlers use of the extension comes through the
tornado application's ``settings`` (``krex_services``, ``krex_region_stats``), put there by
:class:`krex_lab.serverext.app.KrexExtensionApp`: this module does not import the app.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from prometheus_client import CONTENT_TYPE_LATEST
from tornado import web

from ..errors import KrexError
from ..node_status import NodeStatus
from ..region_report import RegionReport
from . import metrics
from .metrics import RegionStats
from .openapi import SessionEntry, SessionsAnswer, StatusAnswer, document
from .processes import Services

T = TypeVar("T")
REGIONS_MAX = 1000

#: the tornado ``settings`` keys under which the extension app puts what the handlers use
SERVICES_SETTING = "krex_services"
REGION_STATS_SETTING = "krex_region_stats"


def handler_settings(services: Services, region_stats: RegionStats) -> dict[str, Services | RegionStats]:
    """What the extension puts in the tornado application's ``settings`` for these handlers."""
    return {SERVICES_SETTING: services, REGION_STATS_SETTING: region_stats}


def fetch_regions(endpoint: str, limit: int) -> list[RegionReport]:
    from .. import protocol
    from ..client import Connection

    conn = Connection(endpoint)
    try:
        result = conn.call(protocol.Regions(limit=limit, ticket=conn.ticket()), timeout=5.0)
        return msgspec.convert(result, list[RegionReport], strict=False)
    finally:
        conn.close()


def fetch_status(endpoint: str) -> NodeStatus:
    from ..client import status

    return NodeStatus.of(status(endpoint, timeout=5.0))


class KrexHandler(ExtensionHandlerMixin, APIHandler):
    auth_resource = "krex"

    @property
    def krex_services(self) -> Services:
        services: Services = self.settings[SERVICES_SETTING]
        return services

    @property
    def krex_region_stats(self) -> RegionStats:
        stats: RegionStats = self.settings[REGION_STATS_SETTING]
        return stats

    async def arbiter_call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking client call in the executor; 503 with the client's message when it fails."""
        try:
            return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
        except KrexError as exc:
            raise web.HTTPError(503, str(exc)) from None

    def write_json(self, data: object) -> None:
        """``data`` (plain data or structs) as the JSON body."""
        self.finish(msgspec.json.encode(data, enc_hook=str), set_content_type="application/json")


class StatusHandler(KrexHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        table = await self.arbiter_call(fetch_status, self.krex_services.endpoint)
        self.write_json(StatusAnswer(**msgspec.structs.asdict(table), server=self.krex_services.describe()))


class SessionsHandler(KrexHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        table = await self.arbiter_call(fetch_status, self.krex_services.endpoint)
        sessions = []
        for g in table.gpus:
            holder = g.holder.session if g.holder else None
            waiting = {q.session for q in g.queue}
            for s in g.sessions:
                row = msgspec.structs.asdict(s)
                sessions.append(SessionEntry(**row, holding=s.id == holder, waiting=s.id in waiting))
        self.write_json(SessionsAnswer(sessions=sessions, simulated=table.arbiter.simulated))


class RegionsHandler(KrexHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        try:
            limit = int(self.get_argument("limit", "50"))
        except ValueError:
            raise web.HTTPError(400, "limit must be an integer") from None
        limit = max(1, min(limit, REGIONS_MAX))
        regions = await self.arbiter_call(fetch_regions, self.krex_services.endpoint, limit)
        self.write_json({"regions": [r.to_dict() for r in regions]})


class MetricsHandler(KrexHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        endpoint = self.krex_services.endpoint
        status: NodeStatus | None
        regions: list[RegionReport] | None
        try:
            status = await self.arbiter_call(fetch_status, endpoint)
            regions = await self.arbiter_call(fetch_regions, endpoint, REGIONS_MAX)
        except web.HTTPError:
            status = regions = None  # scrapes still answer: krex_arbiter_up 0
        body = metrics.render(self.krex_region_stats, status, regions, self.krex_services.describe())
        self.finish(body, set_content_type=CONTENT_TYPE_LATEST)


class SpecHandler(KrexHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.write_json(document())


default_handlers: list[tuple[str, type[KrexHandler]]] = [
    (r"/krex/api/status", StatusHandler),
    (r"/krex/api/sessions", SessionsHandler),
    (r"/krex/api/regions", RegionsHandler),
    (r"/krex/metrics", MetricsHandler),
    (r"/krex/api/spec.json", SpecHandler),
]
