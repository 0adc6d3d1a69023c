"""Claude Code's StopFailure texts (as measured on 2.1.197) → the pause they cause."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ralph_dev.core.agent_faults import (
    API_ACCESS,
    API_OUTAGE,
    CLI_OWN_WAIT,
    OUTAGE_WAIT,
    PROBE_STEP,
    RATE_LIMIT,
    RESET_MARGIN,
    USAGE_LIMIT,
    classify_stop_failure,
    reset_from_headers,
    usage_limit_reset,
)

NOW = datetime(2026, 11, 23, 2, 10, 30, tzinfo=UTC)


@pytest.mark.parametrize(("text", "reset"), [
    ("You've hit your session limit · resets 3:06am (UTC)", datetime(2026, 11, 23, 3, 6)),
    ("You've hit your session limit · resets 2:10am (UTC)", datetime(2026, 11, 23, 2, 10)),
    ("You've hit your session limit · resets 1:00am (UTC)", datetime(2026, 11, 24, 1, 0)),
    ("You've hit your weekly limit · resets Nov 26, 4:22am (UTC)",
     datetime(2026, 11, 26, 4, 22)),
    ("You've hit your limit · resets 3:04pm (UTC)", datetime(2026, 11, 23, 15, 4)),
    ("You've hit your limit · resets 12:30am (UTC)", datetime(2026, 11, 24, 0, 30)),
    ("You've hit your session limit · resets 4am (Europe/Berlin)",
     datetime(2026, 11, 23, 3, 0)),
    ("You've hit your session limit · resets 4am (Mars/Olympus)", datetime(2026, 11, 23, 4)),
    ("You've hit your session limit", None),
])
def test_usage_limit_reset(text: str, reset: datetime | None) -> None:
    expected = reset.replace(tzinfo=UTC) if reset else None
    assert usage_limit_reset(text, NOW) == expected


def test_a_usage_limit_pauses_until_the_minute_it_states_and_then_probes() -> None:
    """Issue 36: back to work at the reset, not after it. Claude Code cuts the reset to
    the minute (21:51:33 is "9:51pm"), so the stated minute is the earliest it lifts: one
    worker's session asks then (``probe``), and while the limit still refuses it asks
    again a step later (a refused request costs nothing)."""
    fault = classify_stop_failure(
        "rate_limit", "You've hit your session limit · resets 3:06am (UTC)", NOW)
    assert fault.kind == USAGE_LIMIT and fault.probe
    assert fault.until == datetime(2026, 11, 23, 3, 6, tzinfo=UTC)
    assert "session limit" in fault.cause
    late = classify_stop_failure(  # the stated minute is over, the limit still holds
        "rate_limit", "You've hit your session limit · resets 2:10am (UTC)", NOW)
    assert late.until == NOW + PROBE_STEP and late.probe


@pytest.mark.parametrize(("error", "text", "kind"), [
    ("rate_limit", "API Error: Server is temporarily limiting requests (not your usage "
                   "limit) · Rate limited", API_OUTAGE),
    ("server_error", "API Error: 529 Overloaded. This is a server-side issue", API_OUTAGE),
    ("unknown", "API Error: stream idle: no bytes for 20000ms", API_OUTAGE),
    ("", "", API_OUTAGE),
    ("authentication_failed", "Invalid API key", API_ACCESS),
    ("billing_error", "Credit balance is too low", API_ACCESS),
])
def test_other_failures_pause_for_a_while(error: str, text: str, kind: str) -> None:
    fault = classify_stop_failure(error, text, NOW)
    assert fault.kind == kind and fault.until > NOW and fault.fix
    if kind == API_OUTAGE:
        assert fault.until == NOW + OUTAGE_WAIT
    assert fault.until - NOW <= timedelta(hours=1)


@pytest.mark.parametrize(("streak", "seconds"), [(1, 10), (2, 20), (3, 30), (40, 30)])
def test_an_outage_that_lasts_backs_off_to_half_a_minute(streak: int, seconds: int) -> None:
    """Issue 24: the step between probes is capped so a recovery is noticed within 30 s
    (each step costs one worker's calls, not every worker's)."""
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    fault = classify_stop_failure("server_error", "API Error: 529 Overloaded", now,
                                  streak=streak)
    assert fault.until == now + timedelta(seconds=seconds)


def test_the_first_outage_wait_comes_from_config() -> None:
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    fault = classify_stop_failure("unknown", "API returned a malformed response", now,
                                  outage_wait=timedelta(seconds=12), streak=2)
    assert fault.until == now + timedelta(seconds=24)


KEY_429 = ("API Error: Request rejected (429) · This request would exceed the rate limit for "
           "your organization of 50 requests per minute.")
"""Claude Code 2.1.197's text for an API key's 429 (measured: docs/claude-code-limits.md)."""


def test_a_key_limit_with_a_read_reset_pauses_until_exactly_then() -> None:
    """The hook read the API's retry-after: that is the pause, not an outage's backoff,
    and everyone goes on at it (the API stated it: no probe first). Refused at or after
    it (clocks differ), the limit is asked again a step later, by one probe."""
    reset = NOW + timedelta(seconds=600)
    fault = classify_stop_failure("rate_limit", KEY_429, NOW, reset_at=reset, streak=3)
    assert fault.kind == USAGE_LIMIT
    assert fault.until == reset and not fault.probe
    assert "failed" not in fault.cause and "rate limit" in fault.cause
    lifted = classify_stop_failure("rate_limit", KEY_429, NOW, reset_at=NOW - timedelta(1))
    assert lifted.until == NOW + PROBE_STEP and lifted.probe  # never a pause in the past


def test_a_subscribers_read_reset_wins_over_the_minute_its_text_states() -> None:
    reset = datetime(2026, 11, 23, 3, 6, 12, tzinfo=UTC)
    fault = classify_stop_failure(
        "rate_limit", "You've hit your session limit · resets 3:06am (UTC)", NOW,
        reset_at=reset)
    assert fault.kind == USAGE_LIMIT and fault.until == reset and not fault.probe


def test_a_key_limit_whose_reset_is_unknown_is_a_rate_limit_not_an_outage() -> None:
    """Claude Code gives up at once only when asked to wait over a minute: never less."""
    fault = classify_stop_failure("rate_limit", KEY_429, NOW, outage_wait=timedelta(seconds=5))
    assert fault.kind == RATE_LIMIT
    assert fault.until == NOW + CLI_OWN_WAIT + RESET_MARGIN
    assert "the model API failed" not in fault.cause and "rate limit" in fault.cause
    later = classify_stop_failure("rate_limit", KEY_429, NOW, streak=3)
    assert later.until == NOW + CLI_OWN_WAIT + RESET_MARGIN  # the backoff's cap is shorter


@pytest.mark.parametrize(("headers", "reset"), [
    ({"retry-after": "600"}, NOW + timedelta(seconds=600)),
    ({"Retry-After": "Mon, 23 Nov 2026 02:20:00 GMT"}, datetime(2026, 11, 23, 2, 20, tzinfo=UTC)),
    ({"anthropic-ratelimit-unified-status": "rejected",
      "anthropic-ratelimit-unified-reset": "1795403460"},
     datetime.fromtimestamp(1795403460, UTC)),
    ({"anthropic-ratelimit-requests-remaining": "0",
      "anthropic-ratelimit-requests-reset": "2026-11-23T02:11:00Z",
      "anthropic-ratelimit-tokens-remaining": "0",
      "anthropic-ratelimit-tokens-reset": "2026-11-23T02:12:30Z",
      "anthropic-ratelimit-input-tokens-remaining": "9000",
      "anthropic-ratelimit-input-tokens-reset": "2026-11-23T02:30:00Z"},
     datetime(2026, 11, 23, 2, 12, 30, tzinfo=UTC)),
    ({"retry-after": "soon"}, None),
    ({}, None),
])
def test_the_reset_a_429_states(headers: dict[str, str], reset: datetime | None) -> None:
    assert reset_from_headers(headers, NOW) == reset
