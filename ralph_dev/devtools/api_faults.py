"""How the real model APIs misbehave, for the scripted APIs to play back.

Each is an answer a brain may give instead of a message: refusals as the real API
sends them (status, JSON body, headers; a subscription's usage limit, an API key's
rate limit, an overload), a request accepted and then left hanging, a stream that is
not one. What the real Claude Code CLI does with each is in the tests
(tests/test_claude_smoke.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Refusal:
    """The API refusing the request, as the real one does: an HTTP error with its JSON
    body and headers (a usage limit: 429 with the ``anthropic-ratelimit-unified-*``
    headers, which a subscriber's Claude Code turns into "You've hit your … limit")."""

    status: int
    error_type: str
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)
    detail: Mapping[str, object] = field(default_factory=dict)
    """More fields of the body's ``error`` object (OpenAI's usage limit: its plan and
    reset)."""


def usage_limit(resets_at: float) -> Refusal:
    """A claude.ai subscription's five-hour limit, lifting at ``resets_at`` (Unix s)."""
    return Refusal(429, "rate_limit_error", "This request would exceed your account's rate "
                   "limit. Please try again later.", {
                       "anthropic-ratelimit-unified-status": "rejected",
                       "anthropic-ratelimit-unified-reset": str(int(resets_at)),
                       "anthropic-ratelimit-unified-representative-claim": "five_hour"})


@dataclass(frozen=True)
class Hang:
    """Accept the request, start the stream, then say nothing (as a stuck API call
    does): Claude Code's spinner keeps printing meanwhile. Ends when the client goes
    or after ``seconds``."""

    seconds: float = 600.0


@dataclass(frozen=True)
class Malformed:
    """Answer 200 with a stream that is not one (a proxy or gateway mangling it): the
    real CLI retries once without streaming, then gives up on the turn ("API returned
    an empty or malformed response")."""


def overloaded() -> Refusal:
    """The API at capacity: 529 ``overloaded_error``, which the CLI retries by itself."""
    return Refusal(529, "overloaded_error", "Overloaded")


def rate_limited(retry_after: int) -> Refusal:
    """An API key's request rate limit (not a subscription's usage limit)."""
    return Refusal(429, "rate_limit_error", "This request would exceed the rate limit for "
                   "your organization of 50 requests per minute.",
                   {"retry-after": str(retry_after)})


def openai_usage_limit(resets_at: float) -> Refusal:
    """A ChatGPT plan's usage limit as the Responses API refuses it: 429
    ``usage_limit_reached`` with the plan and the reset (Unix s, and seconds from now),
    which Codex reads (codex-rs ``UsageLimitReached``) and does not retry."""
    import time

    return Refusal(429, "usage_limit_reached", "The usage limit has been reached", detail={
        "plan_type": "plus", "resets_at": int(resets_at),
        "resets_in_seconds": max(0, int(resets_at - time.time()))})
