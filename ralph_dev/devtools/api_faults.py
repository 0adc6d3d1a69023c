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


def gemini_quota(resets_at: float) -> Refusal:
    """A Gemini plan's quota used up until ``resets_at`` (Unix s), as Google's API refuses
    it: 429 ``RESOURCE_EXHAUSTED`` with ``ErrorInfo`` ``QUOTA_EXHAUSTED`` and the wait in
    ``RetryInfo`` and in its words, which Gemini CLI does not retry (a terminal quota
    error: it ends its turn, quoting the message; one saying "exhausted your capacity" it
    would retry silently, as a passing overload)."""
    import time

    wait = max(1, round(resets_at - time.time()))
    return Refusal(429, "RESOURCE_EXHAUSTED", "You have exhausted your quota on this "
                   f"model. Your quota will reset after {wait}s.", detail={"details": [
                       {"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                        "reason": "QUOTA_EXHAUSTED", "domain": "cloudcode-pa.googleapis.com",
                        "metadata": {"uiMessage": "true", "model": "gemini-2.5-pro"}},
                       {"@type": "type.googleapis.com/google.rpc.RetryInfo",
                        "retryDelay": f"{wait}s"}]})


def gemini_daily_quota() -> Refusal:
    """A Gemini API key's requests-per-day quota used up (it lifts at midnight Pacific):
    Gemini CLI says "You have exhausted your daily quota on this model" and stops."""
    return Refusal(429, "RESOURCE_EXHAUSTED", "You exceeded your current quota, please check "
                   "your plan and billing details.\n* Quota exceeded for metric: generativelan"
                   "guage.googleapis.com/generate_content_free_tier_requests, limit: 50\n"
                   "Please retry in 24.5s.", detail={"details": [
                       {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [
                           {"quotaMetric": "generativelanguage.googleapis.com/"
                                           "generate_content_free_tier_requests",
                            "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
                            "quotaValue": "50"}]},
                       {"@type": "type.googleapis.com/google.rpc.RetryInfo",
                        "retryDelay": "24s"}]})


def gemini_server_error() -> Refusal:
    """Google's API failing: 500 ``INTERNAL``, which Gemini CLI retries by itself (up to ten
    tries, five to thirty seconds apart) before it gives up on the turn."""
    return Refusal(500, "INTERNAL", "An internal error has occurred. Please retry or report "
                   "in https://developers.generativeai.google/guide/troubleshooting")
