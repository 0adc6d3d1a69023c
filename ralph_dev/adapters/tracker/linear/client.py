"""Linear's GraphQL API over gql + aiohttp: the one place ralph-dev sends HTTP to Linear.

Every document it sends lives in ``graphql/*.graphql`` (named operations only)
and a test validates each one against Linear's published schema, so a typo
fails in CI, not at 3 a.m. Failures come back typed: rate limiting
(HTTP 400 + ``RATELIMITED``), 5xx, timeouts, refused connections and garbage
answers are ``LinearUnavailable`` (retryable) and start a backoff with jitter
during which calls are refused, so a controller ticking every few seconds does
not hammer a struggling API; a rejected key is not retryable and names where
the key came from, never the key itself.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import structlog
from gql import Client, GraphQLRequest
from gql.transport.aiohttp import AIOHTTPTransport
from gql.transport.exceptions import (
    TransportError,
    TransportProtocolError,
    TransportQueryError,
    TransportServerError,
)

from ralph_dev.adapters.tracker.base import (
    TrackerError,
    TrackerInputError,
    TrackerUnavailable,
)
from ralph_dev.core.config import ConfigError
from ralph_dev.core.fsutil import read_owner_only_file

if TYPE_CHECKING:
    from ralph_dev.core.config import TrackerSettings

log = structlog.get_logger(__name__)

DEFAULT_URL = "https://api.linear.app/graphql"
URL_ENV = "RALPH_DEV_LINEAR_URL"
KEY_ENV = "LINEAR_API_KEY"
GRAPHQL_DIR = Path(__file__).with_name("graphql")
SLOW_DOWN_BELOW = 0.10
"""Fraction of the hourly allowance left under which requests are spaced out."""


# --- errors ----------------------------------------------------------------------------


class LinearUnavailable(TrackerUnavailable):
    """Linear could not be reached, is rate limiting us, or answered garbage."""


class LinearAuthError(TrackerInputError):
    """Linear refused the API key; retrying will not help."""


class LinearSetupError(TrackerInputError):
    """The project, its teams, states or labels are not usable as configured."""


class LinearNotFound(TrackerInputError):
    """Linear says an entity (issue, state, label…) does not exist."""


class LinearPartialCreate(TrackerError):
    """Some issues of a batch were created before a failure (Linear has no transactions)."""

    retryable = False

    def __init__(self, message: str, created: Sequence[str]) -> None:
        super().__init__(message)
        self.created = list(created)


# --- documents -----------------------------------------------------------------------


@functools.cache
def document(operation: str) -> str:
    """The text of ``graphql/OPERATION.graphql``, with the shared fragments when used."""
    text = (GRAPHQL_DIR / f"{operation}.graphql").read_text()
    if "..." in text:
        text += "\n" + (GRAPHQL_DIR / "fragments.graphql").read_text()
    return text


def operations() -> list[str]:
    """Every operation the client may send (one file each)."""
    return sorted(p.stem for p in GRAPHQL_DIR.glob("*.graphql") if p.stem != "fragments")


# --- the API key -----------------------------------------------------------------------


@dataclass(frozen=True)
class ApiKey:
    """A Linear API key and where it came from; ``repr`` never shows the key."""

    value: str = field(repr=False)
    source: str

    def __str__(self) -> str:
        return f"the Linear API key from {self.source}"


def load_api_key(tracker: TrackerSettings, env: Mapping[str, str] | None = None) -> ApiKey:
    """``LINEAR_API_KEY``, else ``tracker.linear_api_key_file`` (owner-only permissions)."""
    environ = os.environ if env is None else env
    value = (environ.get(KEY_ENV) or "").strip()
    if value:
        return ApiKey(value, f"the {KEY_ENV} environment variable")
    path = tracker.linear_api_key_file
    if path is None:
        raise ConfigError(
            f"no Linear API key: set {KEY_ENV}, or tracker.linear_api_key_file = "
            "'/path/to/key' in the project's config (a file only you can read)"
        )
    path = Path(path).expanduser()
    value = read_owner_only_file(path, "Linear API key file", "tracker.linear_api_key_file")
    return ApiKey(value, f"the file {path}")


# --- the client ------------------------------------------------------------------------


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _hour(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:00Z")


def _header_number(headers: Mapping[str, str] | None, name: str) -> float | None:
    if not headers:
        return None
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        return None


class LinearClient:
    """One GraphQL call per ``execute``: a fresh transport and ``GraphQLRequest`` each
    time, so nothing is shared between concurrent calls or event loops (a CLI call
    and the controller's loop both work) and each call reads its own headers."""

    def __init__(
        self,
        api_key: ApiKey,
        url: str = DEFAULT_URL,
        *,
        timeout: float = 30.0,
        clock: Callable[[], datetime] = _utcnow,
        sleep: Callable[[float], Any] = asyncio.sleep,
        rng: Callable[[], float] = random.random,
        backoff_base: float = 2.0,
        backoff_cap: float = 60.0,
    ) -> None:
        self._key = api_key
        self.url = url
        self.timeout = timeout
        self.clock = clock
        self.sleep = sleep
        self.rng = rng
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.failures = 0
        self.backoff_until: datetime | None = None
        self.backoff_reason = ""
        self.min_gap = 0.0
        """Seconds between requests while the allowance is nearly used up."""
        self.last_request_at: datetime | None = None
        self.hours: dict[str, dict[str, float]] = {}
        self.rate: dict[str, float] = {}

    @property
    def key_source(self) -> str:
        return self._key.source

    def __repr__(self) -> str:
        return f"LinearClient({self.url!r}, key from {self._key.source})"

    def _scrub(self, text: str) -> str:
        return text.replace(self._key.value, "***") if self._key.value else text

    def usage(self) -> dict[str, Any]:
        """Requests and complexity per hour, the last rate-limit headers, the backoff."""
        current = self.hours.get(_hour(self.clock()), {"requests": 0, "complexity": 0})
        return {
            "requests_this_hour": int(current["requests"]),
            "complexity_this_hour": current["complexity"],
            "by_hour": {h: dict(v) for h, v in sorted(self.hours.items())[-24:]},
            "rate_limit": dict(self.rate),
            "slowed_down": self.min_gap > 0,
            "backoff_until": self.backoff_until.isoformat() if self.backoff_until else None,
            "consecutive_failures": self.failures,
        }

    def _record(self, headers: Mapping[str, str] | None) -> None:
        now = self.clock()
        bucket = self.hours.setdefault(_hour(now), {"requests": 0, "complexity": 0})
        bucket["requests"] += 1
        bucket["complexity"] += _header_number(headers, "X-Complexity") or 0
        for name, short in (
            ("X-RateLimit-Requests-Limit", "requests_limit"),
            ("X-RateLimit-Requests-Remaining", "requests_remaining"),
            ("X-RateLimit-Requests-Reset", "requests_reset"),
            ("X-RateLimit-Complexity-Limit", "complexity_limit"),
            ("X-RateLimit-Complexity-Remaining", "complexity_remaining"),
            ("X-RateLimit-Complexity-Reset", "complexity_reset"),
        ):
            value = _header_number(headers, name)
            if value is not None:
                self.rate[short] = value
        self.min_gap = 0.0
        for kind in ("requests", "complexity"):
            limit = self.rate.get(f"{kind}_limit")
            left = self.rate.get(f"{kind}_remaining")
            reset = self.rate.get(f"{kind}_reset")
            if limit and left is not None and left < SLOW_DOWN_BELOW * limit:
                window = (reset / 1000 - now.timestamp()) if reset else 60.0
                if kind == "complexity":
                    left = left / 1000  # roughly: one request costs about 1,000 points
                gap = min(60.0, max(1.0, window / max(left, 1.0)))
                self.min_gap = max(self.min_gap, gap)
        if self.min_gap:
            log.warning("linear_slow_down", gap_s=round(self.min_gap, 1), **{
                k: v for k, v in self.rate.items() if k.endswith("remaining")})

    def _fail(self, reason: str, *, at_least: float = 0.0) -> LinearUnavailable:
        """Start (or extend) the backoff and return the error to raise."""
        self.failures += 1
        delay = min(self.backoff_cap, self.backoff_base * 2 ** min(self.failures - 1, 30))
        delay = max(delay * (0.5 + 0.5 * self.rng()), min(at_least, 3600.0))
        self.backoff_until = self.clock() + timedelta(seconds=delay)
        self.backoff_reason = reason
        log.warning("linear_unavailable", reason=reason, retry_in_s=round(delay, 1),
                    failures=self.failures)
        return LinearUnavailable(
            f"Linear is unavailable ({reason}); ralph-dev retries in {delay:.0f} s "
            "and keeps running workers meanwhile"
        )

    async def execute(self, operation: str, variables: dict[str, Any] | None = None
                      ) -> dict[str, Any]:
        """Run ``operation`` (a file in graphql/) and return its ``data``, or raise typed."""
        now = self.clock()
        if self.backoff_until is not None and now < self.backoff_until:
            wait = (self.backoff_until - now).total_seconds()
            raise LinearUnavailable(
                f"Linear is unavailable ({self.backoff_reason}); backing off for another "
                f"{wait:.0f} s"
            )
        if self.min_gap and self.last_request_at is not None:
            wait = self.min_gap - (now - self.last_request_at).total_seconds()
            if wait > 0:
                await self.sleep(wait)
        request = GraphQLRequest(document(operation), variable_values=variables or {},
                                 operation_name=operation)
        transport = AIOHTTPTransport(url=self.url, headers={"Authorization": self._key.value},
                                     timeout=int(max(1, self.timeout)))
        client = Client(transport=transport, execute_timeout=self.timeout)
        self.last_request_at = self.clock()
        headers: Mapping[str, str] | None = None
        try:
            try:
                async with client as session:
                    data = await session.execute(request)
            finally:
                headers = getattr(transport, "response_headers", None)
                self._record(headers)
        except TransportQueryError as exc:
            raise self._query_error(operation, exc, headers) from None
        except TransportServerError as exc:
            code = exc.code or 0
            if code in (401, 403):
                raise self._auth_error() from None
            raise self._fail(f"HTTP {code} from {operation}") from None
        except TransportProtocolError:
            raise self._fail(f"a malformed answer to {operation} (not GraphQL JSON)") from None
        except AssertionError:  # gql asserts on `{"data": null}` without errors
            raise self._fail(f"an answer to {operation} with neither data nor errors") from None
        except TimeoutError:
            raise self._fail(f"{operation} timed out after {self.timeout:g} s") from None
        except (TransportError, aiohttp.ClientError, OSError) as exc:
            raise self._fail(
                f"{type(exc).__name__} on {operation}: {self._scrub(str(exc))[:200]}"
            ) from None
        if not isinstance(data, dict):
            raise self._fail(f"an answer to {operation} without data")
        self.failures = 0
        self.backoff_until = None
        return data

    def _auth_error(self) -> LinearAuthError:
        log.error("linear_auth_failed", key_source=self._key.source)
        return LinearAuthError(
            f"Linear rejected {self._key}: create a personal API key under Linear → "
            f"Settings → Security & access, and put it in {self._key.source}"
        )

    def _query_error(self, operation: str, exc: TransportQueryError,
                     headers: Mapping[str, str] | None) -> TrackerError:
        errors = exc.errors if isinstance(exc.errors, list) else []
        codes = []
        messages = []
        for err in errors:
            if isinstance(err, dict):
                ext = err.get("extensions") if isinstance(err.get("extensions"), dict) else {}
                codes.append(str(ext.get("code") or ext.get("type") or "").upper())
                messages.append(self._scrub(str(err.get("message") or ""))[:200])
        text = "; ".join(m for m in messages if m) or "no message"
        if "RATELIMITED" in codes:
            reset = _header_number(headers, "X-RateLimit-Requests-Reset")
            wait = (reset / 1000 - self.clock().timestamp()) if reset else 0.0
            return self._fail(f"rate limited on {operation}", at_least=wait)
        if any("AUTHENTICATION" in c for c in codes) or "not authenticated" in text.lower():
            return self._auth_error()
        if any(m.lower().startswith("entity not found") for m in messages):
            return LinearNotFound(f"Linear: {text} (in {operation})")
        if any(("INPUT" in c or "VALIDATION" in c or "FORBIDDEN" in c) for c in codes):
            return TrackerInputError(f"Linear refused {operation}: {text}")
        # Anything else (INTERNAL_SERVER_ERROR, an unknown code, a 5xx with a JSON body)
        # may pass: retry rather than give up on it.
        return self._fail(f"an error on {operation}: {text}")


