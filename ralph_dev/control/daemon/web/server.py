"""The daemon's HTTP server (aiohttp): dashboard, state API, event stream, metrics, health.

Routes:

* ``GET /`` — the dashboard page (``static/``), which draws the state document
  and keeps itself current from the event stream;
* ``GET /api/v1/state`` — the state document (``control/state/status.py``);
* ``GET /api/v1/events`` — server-sent events: ``state`` (the whole document,
  whenever it is refreshed) and ``ralph`` (each new events-log entry);
* ``GET /api/v1/workers/ISSUE/pane?lines=N`` — a worker pane's last lines as plain
  text (``tmux capture-pane -p``: no escape sequences);
* ``GET /metrics`` — Prometheus text format; ``GET /healthz`` — 200 while the
  controller's heartbeat is fresh, else 503 with why.

Access (``access.py``): every route needs the access token, on loopback too (workers
share the host's network): ``Authorization: Bearer …``, or the HttpOnly cookie a one-time
login link (``/?token=…``, printed by ``status`` and ``start``) is exchanged for. With
the token ralph-dev makes itself (none configured) the dashboard is served on loopback
only, answers only loopback Host names (so a web page elsewhere cannot reach it through
DNS rebinding) and leaves ``/healthz`` and ``/metrics`` open there. A token the person
set (``web.token_file`` or ``RALPH_DEV_WEB_TOKEN``, needed for any other address) is
asked on every route, whatever the Host name (a proxy may sit in front). Every answer
carries a strict Content-Security-Policy: issue text is data and the page only ever sets
it as text.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import socket
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from ralph_dev.adapters.files import read_owner_only_file
from ralph_dev.control.daemon.web.access import (
    LoginLinks,
    cookie_name,
    offered_secret,
    session_value,
    token_matches,
)
from ralph_dev.core.config import WebSettings
from ralph_dev.core.environment import WEB_TOKEN
from ralph_dev.core.errors import ConfigError, RalphError
from ralph_dev.core.model import check_identifier
from ralph_dev.core.text import strip_ansi

if TYPE_CHECKING:
    from ralph_dev.control.daemon.services import DaemonServices

log = structlog.get_logger(__name__)

MIN_TOKEN_CHARS = 16
OPEN_ON_LOOPBACK = frozenset({"/healthz", "/metrics"})
"""Routes a loopback dashboard with ralph-dev's own token answers without it: they carry
counts and health, no issue text (Prometheus and a liveness probe on the same host need
no secret)."""
STATIC = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
    "fleet.html": "text/html",
    "fleet.js": "text/javascript",
    "dom.js": "text/javascript",
}
PAGES = frozenset({"index.html", "fleet.html"})
"""Static files served at their own routes (``/``, ``/fleet``), not under /static."""
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
PANE_LINES_MAX = 200
SSE_KEEPALIVE = 15.0
"""Seconds between comment lines on an idle event stream (proxies drop silent ones)."""


class WebError(RalphError):
    """The dashboard cannot be served as configured; the message names the fix."""


def is_loopback(host: str) -> bool:
    if host.casefold() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_token(settings: WebSettings, environ: dict[str, str] | None = None) -> str | None:
    """The access token from ``RALPH_DEV_WEB_TOKEN`` or ``web.token_file``, or None."""
    environ = dict(os.environ) if environ is None else environ
    value = environ.get(WEB_TOKEN, "").strip()
    where = f"the {WEB_TOKEN} environment variable"
    if not value and settings.token_file is not None:
        try:
            value = read_owner_only_file(settings.token_file, "web token file", "web.token_file")
        except ConfigError as exc:
            raise WebError(str(exc)) from None
        where = f"the file {settings.token_file}"
    if not value:
        return None
    if len(value) < MIN_TOKEN_CHARS:
        raise WebError(
            f"the dashboard token from {where} is shorter than {MIN_TOKEN_CHARS} characters; "
            "make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'")
    return value


class DashboardServer:
    """The aiohttp application over one project's :class:`DaemonServices`."""

    def __init__(self, services: DaemonServices, settings: WebSettings, token: str, *,
                 project: str, logins: LoginLinks, configured: bool) -> None:
        self.services = services
        self.settings = settings
        self.token = token
        self.logins = logins
        self.cookie = cookie_name(project)
        self.project = project
        self._session = session_value(token)
        # ralph-dev's own token on loopback: loopback names only, health and counters open;
        # a token the person set: every route asks it, whatever the name (a proxy in front)
        self._loopback_only = is_loopback(settings.host) and not configured
        self._runner: web.AppRunner | None = None
        self.port = 0
        static = resources.files("ralph_dev.control.daemon.web").joinpath("static")
        self._static = {name: static.joinpath(name).read_bytes() for name in STATIC}

    # -- access ---------------------------------------------------------------------

    def _authorized(self, request: web.Request) -> bool:
        bearer = offered_secret(request.headers.get("Authorization", ""))
        cookie = request.cookies.get(self.cookie, "")
        # both compared in constant time, always
        results = [token_matches(bearer, self.token), token_matches(cookie, self._session)]
        return any(results)

    def _login(self, request: web.Request) -> web.StreamResponse:
        """A login link (or the access token itself) → the cookie, and on to ``/`` so the
        token leaves the address bar and the browser's history."""
        offered = request.query.get("token", "")
        if not (self.logins.redeem(offered) or token_matches(offered, self.token)):
            return _refusal(401, "401: this login link was used already or has expired: run "
                            f"`ralph-dev status {self.project}` for a new one.\n")
        response = web.Response(status=303, headers={"Location": "/"})
        response.set_cookie(self.cookie, self._session, httponly=True, samesite="Strict",
                            path="/")
        return response

    @web.middleware
    async def guard(self, request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
        if self._loopback_only and not is_loopback(request.url.host or ""):
            return _refusal(421, "421: this dashboard answers only to loopback names "
                            "(127.0.0.1, localhost).\n")
        if request.path == "/" and "token" in request.query:
            response = self._login(request)
        elif (self._loopback_only and request.path in OPEN_ON_LOOPBACK) \
                or self._authorized(request):
            response = await handler(request)
        else:
            return _refusal(401, (
                "401: this ralph-dev dashboard needs its access token. In a browser open the "
                f"link `ralph-dev status {self.project}` prints (it works once and leaves a "
                "cookie); a script sends 'Authorization: Bearer TOKEN' (the token of "
                f"web.token_file or {WEB_TOKEN}, else the file web-token in the project's "
                "state directory).\n"))
        response.headers.update(SECURITY_HEADERS)
        return response

    # -- handlers -------------------------------------------------------------------

    def app(self) -> web.Application:
        application = web.Application(middlewares=[self.guard], client_max_size=1024)
        application.router.add_get("/", self.page)
        application.router.add_get("/fleet", self.fleet_page)
        application.router.add_get("/static/{name}", self.static)
        application.router.add_get("/api/v1/state", self.state)
        application.router.add_get("/api/v1/fleet", self.fleet)
        application.router.add_get("/api/v1/events", self.events)
        application.router.add_get("/api/v1/workers/{issue}/pane", self.pane)
        application.router.add_get("/metrics", self.metrics)
        application.router.add_get("/healthz", self.healthz)
        return application

    async def page(self, request: web.Request) -> web.Response:
        return web.Response(body=self._static["index.html"], content_type="text/html",
                            charset="utf-8")

    async def fleet_page(self, request: web.Request) -> web.Response:
        return web.Response(body=self._static["fleet.html"], content_type="text/html",
                            charset="utf-8")

    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC or name in PAGES:
            raise web.HTTPNotFound()
        return web.Response(body=self._static[name], content_type=STATIC[name],
                            charset="utf-8")

    async def state(self, request: web.Request) -> web.Response:
        return _json(await self.services.document(max_age=1.0))

    async def fleet(self, request: web.Request) -> web.Response:
        return _json(await self.services.fleet())

    async def pane(self, request: web.Request) -> web.Response:
        try:
            issue = check_identifier(request.match_info["issue"])
            lines = int(request.query.get("lines", "40"))
        except (RalphError, ValueError):
            return _json({"error": "expected /api/v1/workers/KEY-N/pane?lines=N"}, status=400)
        lines = max(1, min(lines, PANE_LINES_MAX))
        text = await self.services.pane_tail(issue, lines)
        if text is None:
            return _json({"issue": issue, "error": "no window for this issue"}, status=404)
        return _json({"issue": issue, "lines": lines, "text": strip_ansi(text).strip("\n")})

    async def metrics(self, request: web.Request) -> web.Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        body = await self.services.metrics_text()
        response = web.Response(body=body)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def healthz(self, request: web.Request) -> web.Response:
        healthy, why = self.services.health()
        return web.Response(status=200 if healthy else 503,
                            text=("ok: " if healthy else "unhealthy: ") + why + "\n")

    async def events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-store",
            "X-Accel-Buffering": "no", **SECURITY_HEADERS})
        await response.prepare(request)
        queue = self.services.hub.subscribe()
        try:
            document = await self.services.document(max_age=1.0)
            await response.write(_sse("state", document))
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), SSE_KEEPALIVE)
                except TimeoutError:
                    await response.write(b": keepalive\n\n")
                    continue
                if item is None:  # the daemon is stopping
                    break
                await response.write(_sse(*item))
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.services.hub.unsubscribe(queue)
        return response

    # -- life -------------------------------------------------------------------------

    async def start(self) -> str:
        """Serve; the URL it can be reached at."""
        host, port = self.settings.host, self.settings.port
        runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise WebError(
                f"cannot serve the dashboard on {host}:{port} ({exc.strerror or exc}); "
                "change web.host / web.port (0 = any free port) or stop what uses the port"
            ) from None
        self._runner = runner
        self.port = int(runner.addresses[0][1]) if runner.addresses else port
        shown = socket.gethostname() if host in ("0.0.0.0", "::") else host  # noqa: S104
        shown = f"[{shown}]" if ":" in shown else shown
        return f"http://{shown}:{self.port}/"

    async def stop(self) -> None:
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await self._runner.cleanup()
            self._runner = None


def _refusal(status: int, text: str) -> web.Response:
    response = web.Response(status=status, text=text)
    response.headers.update(SECURITY_HEADERS)
    return response


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data, default=str), status=status,
                        content_type="application/json")


def _sse(kind: str, data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data, default=str)}\n\n".encode()
