"""The REST API's OpenAPI document (``/krex/api/spec.json``), made from the answers' own types.

Each JSON answer is a msgspec struct (or, for regions, a list of :class:`RegionReport`), so the
document's schemas come from the same definitions the handlers encode: msgspec writes them as
JSON Schema 2020-12, which OpenAPI 3.1 takes as it is. Nothing here is written twice.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .._version import __version__
from ..node_status import NodeStatus, SessionRow
from ..region_report import RegionReport
from .processes import ServicesInfo

__all__ = ["RegionsAnswer", "SessionEntry", "SessionsAnswer", "StatusAnswer", "document"]


class StatusAnswer(NodeStatus, kw_only=True):
    """The body of ``/krex/api/status``: the node's table (as ``krex status --json``) and this
    server's KREX services."""

    server: ServicesInfo


class SessionEntry(SessionRow, kw_only=True):
    """A session as ``/krex/api/sessions`` lists it: its status row, and whether it holds or
    waits for its GPU."""

    holding: bool
    waiting: bool


class SessionsAnswer(msgspec.Struct, kw_only=True):
    """The body of ``/krex/api/sessions``: every session, and whether the GPUs are simulated."""

    sessions: list[SessionEntry]
    simulated: bool


class RegionsAnswer(msgspec.Struct, kw_only=True):
    """The body of ``/krex/api/regions``: recent regions with their reports, newest last (a time
    that was not measured is left out of a report)."""

    regions: list[RegionReport]


_REF = "#/components/schemas/{name}"
#: path (under the server's base_url) -> (summary, answer type or a media type for text)
ROUTES: dict[str, tuple[str, type[msgspec.Struct] | str]] = {
    "/krex/api/status": ("The node's table and this server's KREX services", StatusAnswer),
    "/krex/api/sessions": ("Every registered session, with the GPU it is placed on", SessionsAnswer),
    "/krex/api/regions": ("Recent regions with their reports, newest last", RegionsAnswer),
    "/krex/metrics": ("Prometheus metrics of the node and this server's regions", "text/plain"),
    "/krex/api/spec.json": ("This document", "application/json"),
}

_ERRORS = {
    "403": {"description": "not authorised for the `krex` resource"},
    "503": {"description": "no arbiter answers (the message says why)"},
}


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route of :data:`ROUTES` (paths relative to base_url;
    every request needs the server's authentication, as any jupyter_server API)."""
    structs = [t for _, t in ROUTES.values() if not isinstance(t, str)]
    refs, components = msgspec.json.schema_components(structs, ref_template=_REF)
    by_type = dict(zip(structs, refs, strict=True))
    paths: dict[str, Any] = {}
    for path, (summary, answer) in ROUTES.items():
        if isinstance(answer, str):
            content = {answer: {"schema": {"type": "string"} if answer.startswith("text/") else {"type": "object"}}}
        else:
            content = {"application/json": {"schema": by_type[answer]}}
        op: dict[str, Any] = {
            "summary": summary,
            "security": [{"token": []}],
            "responses": {"200": {"description": summary, "content": content}, "403": _ERRORS["403"]},
        }
        if not isinstance(answer, str):  # the arbiter's answers (metrics still answer: krex_arbiter_up 0)
            op["responses"]["503"] = _ERRORS["503"]
        if path == "/krex/api/regions":
            op["parameters"] = [
                {
                    "name": "limit",
                    "in": "query",
                    "description": "how many of the newest regions (default 50; taken into 1-1000)",
                    "schema": {"type": "integer", "default": 50},
                }
            ]
            op["responses"]["400"] = {"description": "limit is not an integer"}
        paths[path] = {"get": op}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "KREX Lab server extension",
            "version": __version__,
            "description": "The node's GPUs, sessions and regions as a Jupyter server shows them.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "token": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "Authorization",
                    "description": "`token <the server's token>`, or the server's own login cookie",
                }
            },
        },
    }
