"""Linear's GraphQL API over gql + aiohttp: the one place ralph-dev sends HTTP to Linear.

Every document it sends lives in ``graphql/*.graphql`` (named operations only)
and a test validates each one against Linear's published schema, so a typo
fails in CI, not at 3 a.m. Failures come back typed: 5xx, timeouts, refused
connections and garbage answers are ``LinearUnavailable`` (retryable) and start
a backoff with jitter during which calls are refused at once, so a controller
ticking every few seconds neither hammers a struggling API nor blocks on it.
Rate limiting (HTTP 400 + ``RATELIMITED``) waits what Linear asks
(``Retry-After``, else what the dry bucket needs), never more than 5 minutes.
A rejected key is not retryable, backs off too (60 s doubling to 30 min, said
once), and the message names where the key came from, never the key itself.
The backoff and the last rate-limit headers are shared with every other
ralph-dev process of the project through a small file in its state dir.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

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

from ralph_dev.adapters.tracker.linear.apikey import ApiKey
from ralph_dev.adapters.tracker.linear.cache import SharedState
from ralph_dev.adapters.tracker.linear.documents import document, is_mutation
from ralph_dev.adapters.tracker.linear.errors import (
    LinearAuthError,
    LinearNotFound,
    LinearUnavailable,
)
from ralph_dev.core.errors import (
    TrackerError,
    TrackerInputError,
)
from ralph_dev.core.policy import RetryPolicy

log = structlog.get_logger(__name__)

DEFAULT_URL = "https://api.linear.app/graphql"
URL_ENV = "RALPH_DEV_LINEAR_URL"
SLOW_DOWN_BELOW = 0.10
"""Fraction of the hourly allowance left under which requests are spaced out."""


# --- errors ----------------------------------------------------------------------------












# --- documents -----------------------------------------------------------------------









# --- the API key -----------------------------------------------------------------------






# --- the client ------------------------------------------------------------------------

RATE_WAIT_CAP = 300.0
"""Longest pause after ``RATELIMITED`` (plus up to 10 % jitter). Linear's buckets refill
continuously, so a reset header an hour away says when the bucket is FULL again, not
when the next request fits: waiting for it stalled a controller for 612 s."""
AUTH_RETRY = RetryPolicy(initial=60.0, backoff=2.0, cap=1800.0)
"""A refused key is retried after 60 s, doubling up to 30 min, until it works again."""
OUTAGE_JITTER = 0.5
"""An outage's backoff is between half and all of its unjittered wait."""
MAX_SPACING_SLEEP = 5.0
"""Longest the client sleeps to space requests out; a longer gap is refused at once
(``LinearUnavailable``) so a controller's loop never blocks on it."""


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
    and the controller's loop both work) and each call reads its own headers.

    While backing off it refuses at once (``LinearUnavailable``, or ``LinearAuthError``
    for a refused key) without a request; the backoff lives in ``shared_state`` too, so
    every process of the project honours it."""

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
        shared_state: Path | None = None,
    ) -> None:
        self._key = api_key
        self._key_id = hashlib.sha256(api_key.value.encode()).hexdigest()[:16]
        """Names the key in the shared file without revealing it (a new key is tried
        at once, even while the old one is backed off)."""
        self.url = url
        self.timeout = timeout
        self.clock = clock
        self.sleep = sleep
        self.rng = rng
        self.retry = RetryPolicy(initial=backoff_base, backoff=2.0, cap=backoff_cap,
                                 jitter=OUTAGE_JITTER)
        """The backoff after failures in a row (``backoff_base`` doubling up to
        ``backoff_cap``, jittered with a draw from ``rng``)."""
        self.shared = SharedState(shared_state)
        self.instance = uuid.uuid4().hex[:12]
        self.failures = 0
        self.auth_failures = 0
        self.backoff_until: datetime | None = None
        self.backoff_reason = ""
        self.backoff_kind = ""
        self.min_gap = 0.0
        """Seconds between requests while the allowance is nearly used up."""
        self.last_request_at: datetime | None = None
        self.last_complexity = 0.0
        self.hours: dict[str, dict[str, float]] = {}
        self.rate: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"LinearClient({self.url!r}, key from {self._key.source})"

    @property
    def backoff_base(self) -> float:
        return self.retry.initial

    @property
    def backoff_cap(self) -> float:
        return self.retry.cap

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
            "backoff": self.backoff_kind or None,
            "consecutive_failures": self.failures + self.auth_failures,
        }

    def writes_elsewhere_after(self, moment: datetime | None) -> bool:
        """Did another client of the project (another process) write to Linear after
        ``moment``? Its change may not be in our cache yet."""
        writers = self.shared.read().get("writers")
        if not isinstance(writers, dict):
            return False
        return any(isinstance(when, int | float) and who != self.instance
                   and (moment is None or when > moment.timestamp())
                   for who, when in writers.items())

    # -- shared backoff ---------------------------------------------------------------

    def _adopt_shared(self) -> None:
        """Take over a longer backoff another process of the project started."""
        data = self.shared.read()
        until = data.get("backoff_until")
        kind = str(data.get("backoff_kind") or "")
        if not isinstance(until, int | float):
            return
        if kind == "auth" and data.get("key_id") != self._key_id:
            return  # another key failed; ours may be the fixed one
        moment = datetime.fromtimestamp(until, UTC)
        if self.backoff_until is None or moment > self.backoff_until:
            self.backoff_until = moment
            self.backoff_kind = kind
            self.backoff_reason = str(data.get("backoff_reason") or "backing off")[:200]

    def _share_backoff(self) -> None:
        until = self.backoff_until.timestamp() if self.backoff_until else None
        self.shared.update(backoff_until=until, backoff_kind=self.backoff_kind or None,
                           backoff_reason=self.backoff_reason or None,
                           key_id=self._key_id if self.backoff_kind == "auth" else None)

    def _record(self, operation: str, headers: Mapping[str, str] | None) -> None:
        now = self.clock()
        bucket = self.hours.setdefault(_hour(now), {"requests": 0, "complexity": 0})
        bucket["requests"] += 1
        self.last_complexity = _header_number(headers, "X-Complexity") or 0
        bucket["complexity"] += self.last_complexity
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
        for kind, cost in (("requests", 1.0), ("complexity", max(1.0, self.last_complexity))):
            limit = self.rate.get(f"{kind}_limit")
            left = self.rate.get(f"{kind}_remaining")
            if limit and left is not None and left < SLOW_DOWN_BELOW * limit:
                # Linear's bucket refills limit/hour continuously: spaced so, it never runs dry
                self.min_gap = max(self.min_gap, min(60.0, cost * 3600 / limit))
        if self.min_gap:
            log.warning("linear_slow_down", gap_s=round(self.min_gap, 1), **{
                k: v for k, v in self.rate.items() if k.endswith("remaining")})
        shared: dict[str, Any] = {"rate": dict(self.rate), "rate_at": now.timestamp()}
        if is_mutation(operation):  # each process's last write, for the last hour
            writers = self.shared.read().get("writers")
            recent = {who: when for who, when in
                      (writers if isinstance(writers, dict) else {}).items()
                      if isinstance(when, int | float) and now.timestamp() - when < 3600}
            shared["writers"] = {**recent, self.instance: now.timestamp()}
        self.shared.update(**shared)

    def _fail(self, reason: str, *, at_least: float = 0.0, kind: str = "outage",
              ) -> LinearUnavailable:
        """Start (or extend) the backoff and return the error to raise."""
        self.failures += 1
        delay = self.retry.delay(self.failures, draw=self.rng())
        if at_least > 0:
            wait = min(at_least, RATE_WAIT_CAP)
            delay = max(delay, wait + 0.1 * wait * self.rng())
        self.backoff_until = self.clock() + timedelta(seconds=delay)
        self.backoff_reason = reason
        self.backoff_kind = kind
        self._share_backoff()
        log.warning("linear_unavailable", reason=reason, retry_in_s=round(delay, 1),
                    failures=self.failures)
        return LinearUnavailable(
            f"Linear is unavailable ({reason}); ralph-dev retries in {delay:.0f} s "
            "and keeps running workers meanwhile"
        )

    def _refuse_while_backing_off(self, now: datetime) -> None:
        self._adopt_shared()
        if self.backoff_until is None or now >= self.backoff_until:
            return
        wait = (self.backoff_until - now).total_seconds()
        if self.backoff_kind == "auth":
            raise LinearAuthError(f"{self._auth_message()} (not retried for another "
                                  f"{wait:.0f} s)")
        raise LinearUnavailable(
            f"Linear is unavailable ({self.backoff_reason}); backing off for another "
            f"{wait:.0f} s"
        )

    async def _space_out(self, now: datetime) -> None:
        if not self.min_gap or self.last_request_at is None:
            return
        wait = self.min_gap - (now - self.last_request_at).total_seconds()
        if wait > MAX_SPACING_SLEEP:
            raise LinearUnavailable(
                f"Linear's hourly allowance is nearly used up; ralph-dev spaces its requests "
                f"out (next one in {wait:.0f} s)"
            )
        if wait > 0:
            await self.sleep(wait)

    async def execute(self, operation: str, variables: dict[str, Any] | None = None
                      ) -> dict[str, Any]:
        """Run ``operation`` (a file in graphql/) and return its ``data``, or raise typed."""
        now = self.clock()
        self._refuse_while_backing_off(now)
        await self._space_out(now)
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
                self._record(operation, headers)
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
            if isinstance(exc.__cause__, TimeoutError):  # gql wraps aiohttp's timeout
                raise self._fail(f"{operation} timed out after {self.timeout:g} s") from None
            raise self._fail(
                f"{type(exc).__name__} on {operation}: {self._scrub(str(exc))[:200]}"
            ) from None
        if not isinstance(data, dict):
            raise self._fail(f"an answer to {operation} without data")
        self._recovered()
        return data

    def _recovered(self) -> None:
        if self.failures or self.auth_failures or self.backoff_until:
            if self.auth_failures:
                log.info("linear_auth_ok_again", key_source=self._key.source)
            self.failures = self.auth_failures = 0
            self.backoff_until = None
            self.backoff_reason = self.backoff_kind = ""
            until = self.shared.read().get("backoff_until")
            if not isinstance(until, int | float) or until <= self.clock().timestamp():
                self._share_backoff()  # a backoff another process started just now stays

    def _auth_message(self) -> str:
        return (f"Linear rejected {self._key}: create a personal API key under Linear → "
                f"Settings → Security & access, and put it in {self._key.source}")

    def _auth_error(self) -> LinearAuthError:
        """Back off (60 s doubling to 30 min) and say so once until the key works."""
        self.auth_failures += 1
        delay = AUTH_RETRY.delay(self.auth_failures)
        self.backoff_until = self.clock() + timedelta(seconds=delay)
        self.backoff_kind = "auth"
        self.backoff_reason = "the API key was refused"
        self._share_backoff()
        if self.auth_failures == 1:
            log.error("linear_auth_failed", source=self._key.source, retry_in_s=delay)
        return LinearAuthError(self._auth_message())

    def _rate_wait(self, headers: Mapping[str, str] | None) -> float:
        """How long Linear asks us to wait: ``Retry-After``; else, for the bucket that
        ran dry (requests or complexity), the time its hourly refill takes to cover
        what one more request needs, never past its reset; else the sooner reset."""
        retry_after = _header_number(headers, "Retry-After")
        if retry_after is not None:
            return retry_after
        now = self.clock().timestamp()
        dry, resets = [], []
        need = {"Requests": 1.0, "Complexity": max(1.0, self.last_complexity)}
        for kind, wanted in need.items():
            reset = _header_number(headers, f"X-RateLimit-{kind}-Reset")
            left = _header_number(headers, f"X-RateLimit-{kind}-Remaining")
            limit = _header_number(headers, f"X-RateLimit-{kind}-Limit")
            until_reset = reset / 1000 - now if reset is not None else None
            if until_reset is not None:
                resets.append(until_reset)
            if left is None or left >= wanted:
                continue
            refill = (wanted - left) * 3600 / limit if limit else None
            waits = [w for w in (refill, until_reset) if w is not None]
            dry.append(min(waits) if waits else 0.0)
        if dry:
            return max(dry)
        return min(resets) if resets else 0.0

    def _query_error(self, operation: str, exc: TransportQueryError,
                     headers: Mapping[str, str] | None) -> TrackerError:
        errors = exc.errors if isinstance(exc.errors, list) else []
        codes = []
        messages = []
        for err in errors:
            if isinstance(err, dict):
                found = err.get("extensions")
                ext = found if isinstance(found, dict) else {}
                codes.append(str(ext.get("code") or ext.get("type") or "").upper())
                messages.append(self._scrub(str(err.get("message") or ""))[:200])
        text = "; ".join(m for m in messages if m) or "no message"
        if "RATELIMITED" in codes:
            return self._fail(f"rate limited on {operation}", at_least=self._rate_wait(headers),
                              kind="rate")
        if any("AUTHENTICATION" in c for c in codes) or "not authenticated" in text.lower():
            return self._auth_error()
        if any("COMPLEX" in c for c in codes) or "too complex" in text.lower():
            return TrackerInputError(
                f"Linear refused {operation} as too complex ({text}); this is a ralph-dev "
                "bug: please report it")
        if any(m.lower().startswith("entity not found") for m in messages):
            return LinearNotFound(f"Linear: {text} (in {operation})")
        if any(("INPUT" in c or "VALIDATION" in c or "FORBIDDEN" in c) for c in codes):
            return TrackerInputError(f"Linear refused {operation}: {text}")
        # Anything else (INTERNAL_SERVER_ERROR, an unknown code, a 5xx with a JSON body)
        # may pass: retry rather than give up on it.
        return self._fail(f"an error on {operation}: {text}")
