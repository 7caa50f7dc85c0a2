"""A JupyterHub proxy that only remembers its routes (no configurable-http-proxy, no node): the
tests talk to the hub's API and to the service directly, never through a proxy. Not a security
stand-in: authentication and authorisation are the real hub's."""

from __future__ import annotations

from typing import Any

from jupyterhub.proxy import Proxy


class MemoryProxy(Proxy):
    should_start = False
    routes: dict[str, dict[str, Any]] = {}

    async def add_route(self, routespec: str, target: str, data: dict[str, Any]) -> None:
        self.routes[routespec] = {"routespec": routespec, "target": target, "data": data}

    async def delete_route(self, routespec: str) -> None:
        self.routes.pop(routespec, None)

    async def get_all_routes(self) -> dict[str, dict[str, Any]]:
        return dict(self.routes)
