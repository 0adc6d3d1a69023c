"""Linear webhooks, optional: a nudge that makes the controller tick now.

Polling is the source of truth and stays the safety net: a webhook carries no
state ralph-dev acts on, it only wakes the controller's tick early (the tick
re-reads the tracker anyway). So every request we cannot trust is dropped, and
one we can is answered 200 at once (Linear wants an answer within 5 s and
retries failures for hours) without waiting for the tick.

Trust, in order: the ``Linear-Signature`` header must be the hex HMAC-SHA256
of the raw body under the signing secret (constant-time compare, before the
body is parsed); the body's ``webhookTimestamp`` (UNIX ms; else the
``Linear-Timestamp`` header) must be within 60 s of now, so a captured
delivery cannot be replayed later; a ``Linear-Delivery`` id seen before is
acknowledged and ignored (Linear retries deliveries). The secret comes from
``RALPH_DEV_LINEAR_WEBHOOK_SECRET`` only, and is never logged; payload text
(titles, comments) is never logged either.

The port may face the internet, so nobody can hold the controller's resources:
a connection must send its request head within ``HEADER_TIMEOUT_S`` and its
body within ``BODY_TIMEOUT_S``; beyond ``MAX_CONNECTIONS`` open connections new
ones are closed at once (file descriptors are the controller's too: running
out of them once stopped its ticks); a body nested too deeply for the parser is
a 400; rejections are logged at most ``LOG_BURST`` times a minute.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web

from ralph_dev.core.errors import RalphError
from ralph_dev.core.jsonsafe import TooDeep, parse_json

log = structlog.get_logger(__name__)

SECRET_ENV = "RALPH_DEV_LINEAR_WEBHOOK_SECRET"  # noqa: S105 - a variable name, not a secret
PATH = "/linear/webhook"
"""Where Linear posts (configure the webhook URL as http(s)://HOST:PORT/linear/webhook)."""

MAX_SKEW_S = 60.0
MAX_BODY_BYTES = 1 << 20
DELIVERIES_KEPT = 4096
"""Delivery ids remembered for dedupe: Linear retries within hours, a few thousand is plenty."""
HEADER_TIMEOUT_S = 10.0
"""A connection that has not sent a whole request head by then is closed (aiohttp's
keep-alive timer runs from the connection's start and is not reset by partial data)."""
BODY_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64
LOG_BURST = 20
"""Rejections logged per minute; the rest are counted and the count logged with the next."""
WAKE_TYPES = frozenset({"Issue", "Comment"})
"""Entity types that may change what the controller should do (labels ride on Issue)."""


class WebhookError(RalphError):
    """The listener cannot start; the message names the setting to fix."""


@dataclass(frozen=True)
class Verdict:
    """What one delivery came to: the HTTP answer and whether it woke the tick."""

    status: int
    reason: str
    woke: bool = False
    kind: str | None = None
    """The payload's entity type (``Issue``, ``Comment``…), once it is trusted."""


def signature(secret: str, body: bytes) -> str:
    """The ``Linear-Signature`` Linear computes: hex HMAC-SHA256 of the raw body."""
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def secret_from_env(environ: Mapping[str, str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    secret = environ.get(SECRET_ENV, "").strip()
    if not secret:
        raise WebhookError(
            f"tracker.webhook_port is set but {SECRET_ENV} is empty: set it to the webhook's "
            "signing secret (Linear → Settings → API → Webhooks), or remove webhook_port to "
            "rely on polling alone"
        )
    return secret


def _timestamp_ms(payload: Mapping[str, Any], header: str | None) -> float | None:
    value: Any = payload.get("webhookTimestamp")
    if value is None:
        value = header
    if isinstance(value, bool):
        return None
    try:
        stamp = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return stamp if math.isfinite(stamp) else None


class RateLimitedLog:
    """At most ``burst`` lines per ``window`` seconds; what was held back is counted and
    reported (``suppressed=N``) on the next line let through."""

    def __init__(self, burst: int = LOG_BURST, window: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.window = window
        self.clock = clock
        self._window_start = -math.inf
        self._written = 0
        self.suppressed = 0

    def warning(self, event: str, **details: Any) -> bool:
        now = self.clock()
        if now - self._window_start >= self.window:
            self._window_start, self._written = now, 0
        if self._written >= self.burst:
            self.suppressed += 1
            return False
        self._written += 1
        if self.suppressed:
            details["suppressed"], self.suppressed = self.suppressed, 0
        log.warning(event, **details)
        return True


class _Refused(asyncio.Protocol):
    """The answer to a connection over the cap: closed before anything is read."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class Deliveries:
    """Delivery ids already handled, oldest forgotten first (bounded memory)."""

    def __init__(self, limit: int = DELIVERIES_KEPT) -> None:
        self.limit = limit
        self._seen: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, delivery: str) -> bool:
        return delivery in self._seen

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, delivery: str) -> None:
        self._seen[delivery] = None
        self._seen.move_to_end(delivery)
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)


class WebhookListener:
    """Checks deliveries and wakes the controller; the HTTP server is a thin shell."""

    def __init__(
        self,
        secret: str,
        wake: asyncio.Event,
        *,
        clock: Callable[[], float] = time.time,
        max_skew: float = MAX_SKEW_S,
        deliveries: int = DELIVERIES_KEPT,
        min_interval: float = 1.0,
        on_wake: Callable[[], None] | None = None,
        header_timeout: float = HEADER_TIMEOUT_S,
        body_timeout: float = BODY_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        if not secret:
            raise WebhookError(f"the webhook signing secret is empty: set {SECRET_ENV}")
        self._secret = secret
        self.wake = wake
        self.clock = clock
        self.max_skew = max_skew
        self.min_interval = min_interval
        self.on_wake = on_wake
        """Told before each wake (the tracker then polls even inside its poll interval)."""
        self.deliveries = Deliveries(deliveries)
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.max_connections = max_connections
        self.refused = 0
        """Connections closed because ``max_connections`` were open."""
        self.rejections = RateLimitedLog()
        self.woken = 0
        self._last_wake: float | None = None
        self._pending: asyncio.TimerHandle | None = None
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self.port: int | None = None

    def __repr__(self) -> str:  # never show the secret, even in a traceback
        return f"WebhookListener(port={self.port}, woken={self.woken})"

    def open_connections(self) -> int:
        """Connections being served now (the cap counts these)."""
        server = self._runner.server if self._runner is not None else None
        return len(server.connections) if server is not None else 0

    # -- the checks (pure but for the dedupe memory) ------------------------------

    def judge(self, body: bytes, headers: Mapping[str, str]) -> Verdict:
        given = headers.get("Linear-Signature", "").strip().lower()
        if not given or not hmac.compare_digest(
            given.encode("ascii", "replace"), signature(self._secret, body).encode("ascii")
        ):
            return Verdict(401, "bad signature")
        try:
            payload = parse_json(body)
        except TooDeep:
            return Verdict(400, "body nested too deeply")
        except (ValueError, UnicodeDecodeError):
            return Verdict(400, "body is not JSON")
        if not isinstance(payload, dict):
            return Verdict(400, "body is not a JSON object")
        stamp = _timestamp_ms(payload, headers.get("Linear-Timestamp"))
        if stamp is None:
            return Verdict(400, "no webhookTimestamp")
        skew = abs(self.clock() - stamp / 1000.0)
        if skew > self.max_skew:
            return Verdict(401, f"timestamp {skew:.0f}s away from now (limit {self.max_skew:g}s)")
        # The delivery header is not signed: the body's hash is remembered too, so
        # a captured delivery replayed under a new id is still a duplicate.
        delivery = "id:" + headers.get("Linear-Delivery", "").strip()[:200]
        digest = "body:" + hashlib.sha256(body).hexdigest()
        if delivery in self.deliveries or digest in self.deliveries:
            return Verdict(200, "duplicate delivery")
        if delivery != "id:":
            self.deliveries.add(delivery)
        self.deliveries.add(digest)
        kind = payload.get("type")
        shown = kind[:40] if isinstance(kind, str) else None
        if shown is None or kind not in WAKE_TYPES:
            return Verdict(200, "event type not acted on", kind=shown)
        return Verdict(200, "accepted", woke=True, kind=shown)

    def poke(self) -> None:
        """Wake the tick now, or once at the end of ``min_interval`` when one just ran.

        A burst of deliveries (a bulk edit in Linear) must not turn into a burst
        of ticks, each spending tracker requests.
        """
        now = time.monotonic()
        if self._last_wake is None or now - self._last_wake >= self.min_interval:
            self._fire()
        elif self._pending is None:
            delay = self.min_interval - (now - self._last_wake)
            self._pending = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._pending = None
        self._last_wake = time.monotonic()
        self.woken += 1
        if self.on_wake is not None:
            self.on_wake()
        self.wake.set()

    # -- HTTP -------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.Response:
        try:
            async with asyncio.timeout(self.body_timeout):
                body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self.rejections.warning("webhook_rejected", status=413, why="body too large")
            return web.Response(status=413, text="body too large\n")
        except TimeoutError:
            self.rejections.warning("webhook_rejected", status=408, why="body too slow",
                                    remote=request.remote)
            return web.Response(status=408, text="body too slow\n")
        verdict = self.judge(body, request.headers)
        if verdict.woke:
            self.poke()
        if verdict.status == 200:
            log.info("webhook", why=verdict.reason, type=verdict.kind, woke=verdict.woke,
                     delivery=request.headers.get("Linear-Delivery", "")[:80])
        else:
            self.rejections.warning("webhook_rejected", status=verdict.status,
                                    why=verdict.reason, remote=request.remote)
        return web.Response(status=verdict.status, text=verdict.reason + "\n")

    def app(self) -> web.Application:
        application = web.Application(client_max_size=MAX_BODY_BYTES)
        application.router.add_post(PATH, self.handle)
        return application

    async def start(self, host: str, port: int) -> int:
        """Serve on host:port (0 picks a free port); returns the bound port."""
        runner = web.AppRunner(self.app(), access_log=None, keepalive_timeout=self.header_timeout)
        await runner.setup()
        handlers = runner.server
        assert handlers is not None  # set by setup()

        def connection() -> asyncio.Protocol:
            if len(handlers.connections) >= self.max_connections:  # = open_connections()
                self.refused += 1
                self.rejections.warning("webhook_refused", why="too many connections",
                                        limit=self.max_connections)
                return _Refused()
            return handlers()

        try:
            self._server = await asyncio.get_running_loop().create_server(
                connection, host, port, reuse_address=True)
        except OSError as exc:
            await runner.cleanup()
            raise WebhookError(
                f"cannot listen for Linear webhooks on {host}:{port} ({exc.strerror or exc}); "
                "change tracker.webhook_host / tracker.webhook_port or stop what uses the port"
            ) from None
        self._runner = runner
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("webhook_listening", host=host, port=self.port, path=PATH)
        return self.port

    async def stop(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            log.info("webhook_stopped", port=self.port)
