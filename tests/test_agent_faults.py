"""Claude Code's StopFailure texts (as measured on 2.1.197) → the pause they cause."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ralph_dev.core.agent_faults import (
    API_ACCESS,
    API_OUTAGE,
    OUTAGE_WAIT,
    RESET_MARGIN,
    USAGE_LIMIT,
    classify_stop_failure,
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


def test_a_usage_limit_pauses_until_just_after_the_reset() -> None:
    fault = classify_stop_failure(
        "rate_limit", "You've hit your session limit · resets 3:06am (UTC)", NOW)
    assert fault.kind == USAGE_LIMIT
    assert fault.until == datetime(2026, 11, 23, 3, 6, tzinfo=UTC) + RESET_MARGIN
    assert "session limit" in fault.cause
    late = classify_stop_failure(  # the stated minute is over, the limit still holds
        "rate_limit", "You've hit your session limit · resets 2:10am (UTC)", NOW)
    assert late.until == NOW + timedelta(minutes=1)


@pytest.mark.parametrize(("error", "text", "kind"), [
    ("rate_limit", "API Error: Server is temporarily limiting requests (not your usage "
                   "limit) · Rate limited", API_OUTAGE),
    ("rate_limit", "API Error: Request rejected (429) · This request would exceed the rate "
                   "limit for your organization", API_OUTAGE),
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
