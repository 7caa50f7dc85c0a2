"""The KREX admin page: a JupyterHub service (``python -m krex_lab.hub.admin_page``).

Every GPU of the node with its holder, queue and sessions by user; region history with two
server-side charts (utilisation over time, a Gantt strip of who held each GPU when); quota use
per user; buttons that end a region or a session's queue (``Release(force=True)`` from the
service's own arbiter session: root, so the arbiter allows it).

Authentication is JupyterHub's OAuth (:class:`~jupyterhub.services.auth.HubOAuthenticated`, the
hub's tokens also work in an ``Authorization: token …`` header). Authorisation: the hub first
checks the service's access scope (``access:services!service=krex-admin``); then every handler
requires the scope ``custom:krex:admin`` (the ``krex-admin`` role of ``krex hub-config``) or a
hub admin. Anyone else gets 403. Buttons post with tornado's XSRF token.

It runs as root, like the hub that starts it: the arbiter shows root everything (other users'
sessions in full), which is what an admin needs. All arbiter calls are blocking ZeroMQ calls with
timeouts, run in a thread, never on the tornado loop. Listens where ``JUPYTERHUB_SERVICE_URL``
says (the hub sets it for a managed service).
"""

from __future__ import annotations

import asyncio
import collections
import html
import logging
import os
import secrets
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict
from urllib.parse import urlencode, urlparse

import msgspec
from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.ioloop import PeriodicCallback

from .. import protocol
from ..arbiter.history import HistoryRow, Recent, Usage
from ..errors import KrexError
from ..node_status import NodeStatus, holder_row, queue_row
from ..region_report import RegionReport
from .charts import Bar, Sample, gantt_svg, utilisation_svg
from .config import ADMIN_SCOPE

if TYPE_CHECKING:
    from ..arbiter.quotas import Quotas

log = logging.getLogger("krex.hub.service")
TEMPLATES = Path(__file__).with_name("templates")
#: how many region reports the page asks for
REGIONS_LIMIT = 200


class HubUser(TypedDict, total=False):
    """What the page reads of the hub's user (or service) model, JupyterHub's JSON."""

    name: str
    admin: bool
    scopes: list[str]


class PageHistory(msgspec.Struct):
    """The arbiter's region history as the page shows it: the last regions and a week's usage."""

    recent: list[HistoryRow]
    usage: Usage


class QuotaLimits(msgspec.Struct, kw_only=True):
    """The limits of a user the page shows."""

    sessions_per_user: int
    queued_per_user: int
    max_hold: float


class QuotaUse(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One user's sessions, queued requests and held regions, with their limits where known."""

    user: str
    uid: int | None
    #: None: no quotas configured, or the user's could not be read
    limits: QuotaLimits | None
    sessions: int = 0
    queued: int = 0
    holding: int = 0
    #: an admin, whom no limit applies to (None: not known)
    exempt: bool | None = None


def is_krex_admin(user: HubUser | None) -> bool:
    """The hub's user (or service) model may use this page: scope ``custom:krex:admin`` or a hub admin."""
    if not user:
        return False
    scopes = set(user.get("scopes") or ())
    return ADMIN_SCOPE in scopes or user.get("admin") is True


class Arbiter:
    """The arbiter as the service sees it (blocking calls; run them in a thread)."""

    def __init__(self, endpoint: str | None = None) -> None:
        self.endpoint = endpoint or os.environ.get("KREX_ENDPOINT") or ""

    def _connection(self) -> Any:
        from ..client import Connection

        return Connection(self.endpoint or None)

    def status(self) -> NodeStatus:
        from ..client import status

        return NodeStatus.of(status(self.endpoint or None, timeout=5.0))

    def regions(self, limit: int = REGIONS_LIMIT) -> list[RegionReport]:
        conn = self._connection()
        try:
            result = conn.call(protocol.Regions(limit=limit, ticket=conn.ticket()), timeout=5.0)
            return msgspec.convert(result, list[RegionReport], strict=False)
        finally:
            conn.close()

    def history(self, limit: int = REGIONS_LIMIT) -> PageHistory | None:
        """The last regions and a week's usage from the arbiter's region history, or None when
        this arbiter (or this krex-lab) has none."""
        request_type = getattr(protocol, "History", None)
        if request_type is None:
            return None
        conn = self._connection()
        try:
            # An identity ticket is good for one request: each call gets its own.
            recent = conn.call(request_type(limit=limit, ticket=conn.ticket()), timeout=5.0)
            usage = conn.call(
                request_type(usage=True, since=time.time() - 7 * 86400, ticket=conn.ticket()), timeout=5.0
            )
            return PageHistory(
                recent=msgspec.convert(recent, Recent, strict=False).rows,
                usage=msgspec.convert(usage, Usage, strict=False),
            )
        except KrexError as exc:  # an older arbiter: "unknown op"
            log.info("no region history from the arbiter: %s", exc)
            return None
        finally:
            conn.close()

    def end_region(self, region: str) -> RegionReport:
        """End (or withdraw) ``region`` whoever holds it, as root: ``EndRegion`` with this process's
        identity ticket (no session of the page's own, which regions would drain and freeze)."""
        conn = self._connection()
        try:
            result: RegionReport = conn.call(protocol.EndRegion(region=region, ticket=conn.ticket()), timeout=15.0)
            return result
        finally:
            conn.close()

    def end_queue(self, session: str) -> list[str]:
        """Withdraw every queued request of ``session``; returns the regions withdrawn."""
        table = self.status()
        ids = [q.region for g in table.gpus for q in g.queue if q.session == session]
        for region in ids:
            self.end_region(region)
        return ids


class Telemetry:
    """What the page keeps between polls: utilisation samples and who held each GPU when."""

    def __init__(self, keep: float = 6 * 3600.0) -> None:
        self.keep = keep
        self.samples: collections.deque[Sample] = collections.deque(maxlen=100_000)
        self.bars: dict[str, Bar] = {}
        self.last_status: NodeStatus | None = None

    def record(self, table: NodeStatus, now: float | None = None) -> None:
        now = time.time() if now is None else now
        self.last_status = table
        for g in table.gpus:
            self.samples.append((now, g.index, g.utilization_gpu, g.memory_used))
            h = g.holder
            if h and h.state == "held":
                start = now - (h.held_s or 0.0)
                old = self.bars.get(h.region)
                self.bars[h.region] = (g.index, str(h.user), old[2] if old else start, now, h.region)
        while self.samples and self.samples[0][0] < now - self.keep:
            self.samples.popleft()
        for rid in [r for r, b in self.bars.items() if b[3] < now - self.keep]:
            del self.bars[rid]

    def add_regions(self, reports: list[RegionReport]) -> None:
        """Finished regions with wall-clock times (history rows, or ``Regions`` reports that carry them)."""
        for r in reports:
            end = r.released_at
            if not end or r.gpu < 0:
                continue
            if not r.granted and not r.granted_at and not r.hold_s:
                continue  # withdrawn: never held
            start = r.granted_at or end - (r.hold_s or 0.0)
            self.bars[r.region] = (r.gpu, r.user, start, end, r.region)


def quota_use(table: NodeStatus, quotas: Quotas | None) -> list[QuotaUse]:
    """Per user: sessions, queued requests, regions held, and the user's limits where known."""
    users: dict[str, QuotaUse] = {}

    def entry(user: str | None, uid: int | None) -> QuotaUse:
        return users.setdefault(str(user), QuotaUse(user=str(user), uid=uid, limits=None))

    for g in table.gpus:
        for s in g.sessions:
            entry(s.user, s.uid).sessions += 1
        for q in g.queue:
            entry(q.user, q.uid).queued += 1
        if g.holder:
            entry(g.holder.user, g.holder.uid).holding += 1
    for u in users.values():
        if quotas is not None and u.uid is not None:
            try:
                lim = quotas.limits_for(u.uid)
                u.limits = QuotaLimits(
                    sessions_per_user=lim.sessions_per_user, queued_per_user=lim.queued_per_user, max_hold=lim.max_hold
                )
                u.exempt = quotas.is_admin(u.uid)
            except (KeyError, OSError, ValueError):
                pass
    return sorted(users.values(), key=lambda u: u.user)


def load_quotas(config_file: str) -> Quotas | None:
    """The arbiter's ``Quotas`` as ``config_file`` (the hub's config: ``krex hub-config``) sets them."""
    if not config_file:
        return None
    from traitlets.config.loader import PyFileConfigLoader

    from ..arbiter.quotas import Quotas

    path = Path(config_file)
    try:
        config = PyFileConfigLoader(path.name, path=str(path.parent)).load_config()
    except Exception as exc:  # a config that fails to load must not take the page down
        log.warning("cannot read quotas from %s: %s", config_file, exc)
        return None
    return Quotas(config=config)


# -- handlers -------------------------------------------------------------------------------------


class AdminHandler(HubOAuthenticated, web.RequestHandler):
    """Base of every page and action: authenticated by the hub, then admins only."""

    @property
    def arbiter(self) -> Arbiter:
        a: Arbiter = self.settings["krex_arbiter"]
        return a

    @property
    def telemetry(self) -> Telemetry:
        t: Telemetry = self.settings["krex_telemetry"]
        return t

    def check_xsrf_cookie(self) -> None:
        # tornado checks XSRF before it asks who the user is; a request that carries a hub token in
        # its Authorization header (a script, not a browser: no cookie to ride on) is exempt, as
        # in JupyterHub itself, once the token is known to be valid.
        if self.request.headers.get("Authorization"):
            self.current_user  # noqa: B018 - authenticates, marking a token-authenticated request
        super().check_xsrf_cookie()

    def require_admin(self) -> HubUser:
        user: HubUser | None = self.current_user
        if user is None:
            raise web.HTTPError(403)
        if not is_krex_admin(user):
            log.warning(
                "refused %s %s: %s is not a KREX admin", self.request.method, self.request.path, user.get("name")
            )
            raise web.HTTPError(403, f"{user.get('name')} is not a KREX admin (scope {ADMIN_SCOPE})")
        return user

    async def blocking(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


class PageHandler(AdminHandler):
    @web.authenticated
    async def get(self) -> None:
        user = self.require_admin()
        error = ""
        table = NodeStatus()
        regions: list[RegionReport] = []
        history: PageHistory | None = None
        try:
            table = await self.blocking(self.arbiter.status)
            self.telemetry.record(table)
            regions = await self.blocking(self.arbiter.regions)
            history = await self.blocking(self.arbiter.history)
        except KrexError as exc:
            error = str(exc)
        recent: list[RegionReport] = list(history.recent) if history else regions
        self.telemetry.add_regions(recent)
        gpus = [g.index for g in table.gpus]
        charts = await self.blocking(self._charts, gpus)
        self.render(
            "admin.html",
            user=user,
            table=table,
            regions=list(reversed(recent))[:50],
            history_source="region history (SQLite)" if history else "recent regions (in memory)",
            usage=history.usage if history else None,
            quotas=quota_use(table, self.settings.get("krex_quotas")),
            charts=charts,
            error=error,
            message=self.get_argument("message", ""),
            base=self.settings["krex_prefix"],
            esc=html.escape,
            holder_row=holder_row,
            queue_row=queue_row,
        )

    def _charts(self, gpus: list[int]) -> dict[str, str]:
        t = self.telemetry
        return {
            "utilisation": utilisation_svg(list(t.samples), gpus),
            "gantt": gantt_svg(list(t.bars.values()), gpus),
        }


class StatusHandler(AdminHandler):
    """The same data as JSON (the node table, as root sees it)."""

    @web.authenticated
    async def get(self) -> None:
        self.require_admin()
        try:
            table = await self.blocking(self.arbiter.status)
        except KrexError as exc:
            raise web.HTTPError(503, str(exc)) from None
        self.telemetry.record(table)
        quotas = quota_use(table, self.settings.get("krex_quotas"))
        self.write({"status": msgspec.to_builtins(table), "quotas": msgspec.to_builtins(quotas)})


class EndRegionHandler(AdminHandler):
    @web.authenticated
    async def post(self) -> None:
        user = self.require_admin()
        region = self.get_body_argument("region")
        try:
            report = await self.blocking(self.arbiter.end_region, region)
            log.warning("KREX admin %s ended region %s", user.get("name"), region)
            message = f"ended region {region} ({report.released_by})"
        except KrexError as exc:
            message = f"could not end {region}: {exc}"
        self._done(message)

    def _done(self, message: str) -> None:
        if "application/json" in self.request.headers.get("Accept", ""):
            self.write({"message": message})
        else:
            self.redirect(self.settings["krex_prefix"] + "?" + urlencode({"message": message}))


class EndQueueHandler(EndRegionHandler):
    @web.authenticated
    async def post(self) -> None:
        user = self.require_admin()
        session = self.get_body_argument("session")
        try:
            ended = await self.blocking(self.arbiter.end_queue, session)
            log.warning("KREX admin %s withdrew the queue of session %s: %s", user.get("name"), session, ended)
            message = f"withdrew {len(ended)} queued request(s) of session {session}"
        except KrexError as exc:
            message = f"could not withdraw the queue of {session}: {exc}"
        self._done(message)


def make_app(
    prefix: str = "/",
    arbiter: Arbiter | None = None,
    quotas: Quotas | None = None,
    cookie_secret: bytes | None = None,
) -> web.Application:
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    return web.Application(
        [
            (prefix, PageHandler),
            (prefix + "api/status", StatusHandler),
            (prefix + "end-region", EndRegionHandler),
            (prefix + "end-queue", EndQueueHandler),
            (prefix + "oauth_callback", HubOAuthCallbackHandler),
        ],
        template_path=str(TEMPLATES),
        cookie_secret=cookie_secret or secrets.token_bytes(32),
        xsrf_cookies=True,
        krex_arbiter=arbiter or Arbiter(),
        krex_telemetry=Telemetry(),
        krex_quotas=quotas,
        krex_prefix=prefix,
    )


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m krex_lab.hub.admin_page", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=os.environ.get("KREX_HUB_CONFIG", ""), help="hub config with c.Quotas")
    parser.add_argument("--poll", type=float, default=5.0, help="seconds between telemetry samples (0: off)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/krex-admin/")
    app = make_app(prefix, quotas=load_quotas(args.config))
    asyncio.run(_serve(app, url.hostname or "127.0.0.1", url.port or 80, args.poll))
    return 0


async def _serve(app: web.Application, host: str, port: int, poll: float) -> None:
    arbiter: Arbiter = app.settings["krex_arbiter"]
    telemetry: Telemetry = app.settings["krex_telemetry"]
    server = HTTPServer(app, xheaders=True)
    server.listen(port, host)
    log.info(
        "KREX admin page at http://%s:%d%s (arbiter %s)", host, port, app.settings["krex_prefix"], arbiter.endpoint
    )

    async def sample() -> None:
        try:
            telemetry.record(await asyncio.get_running_loop().run_in_executor(None, arbiter.status))
        except KrexError as exc:
            log.debug("no telemetry sample: %s", exc)

    if poll > 0:
        PeriodicCallback(sample, poll * 1000).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
