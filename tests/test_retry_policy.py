"""One ``RetryPolicy`` times every backoff: its delays, its jitter (the caller's draw),
and the three backoffs that once computed their own (an API outage's probes, the Linear
client's outage and refused-key backoffs) giving the very waits they gave before."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ralph_dev.adapters.tracker.linear.apikey import ApiKey
from ralph_dev.adapters.tracker.linear.client import AUTH_RETRY, LinearClient
from ralph_dev.core.agent_faults import (
    OUTAGE_WAIT_CAP,
    classify_stop_failure,
    outage_retry,
)
from ralph_dev.core.policy import Blame, RetryPolicy, blame

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def test_the_wait_starts_at_initial_and_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(initial=10.0, backoff=2.0, cap=100.0)
    assert [policy.delay(n) for n in range(7)] == [0, 10, 20, 40, 80, 100, 100]


def test_no_failure_means_no_wait_and_a_huge_count_no_overflow() -> None:
    policy = RetryPolicy(initial=1.0, cap=30.0)
    assert policy.delay(0) == policy.delay(-3) == 0.0
    assert policy.delay(10**9) == 30.0


def test_another_coefficient_grows_by_it() -> None:
    assert [RetryPolicy(initial=1.0, backoff=3.0, cap=1e9).delay(n) for n in (1, 2, 3)] == \
        [1.0, 3.0, 9.0]


def test_without_jitter_the_draw_changes_nothing() -> None:
    policy = RetryPolicy(initial=4.0, cap=60.0)
    assert policy.delay(3, draw=0.0) == policy.delay(3, draw=0.7) == policy.delay(3) == 16.0


@pytest.mark.parametrize(("draw", "share"), [(0.0, 0.5), (0.5, 0.75), (0.999, 0.9995),
                                             (1.0, 1.0)])
def test_jitter_takes_up_to_its_fraction_off_by_the_callers_draw(draw: float,
                                                                   share: float) -> None:
    policy = RetryPolicy(initial=4.0, cap=60.0, jitter=0.5)
    assert policy.delay(3, draw=draw) == pytest.approx(16.0 * share)


def test_a_jittered_policy_without_a_draw_gives_its_longest_wait() -> None:
    policy = RetryPolicy(initial=4.0, cap=60.0, jitter=0.5)
    assert policy.delay(3) == 16.0
    assert policy.delay(0, draw=0.0) == 0.0  # no failure: nothing to wait, jittered or not


def test_a_draw_outside_zero_to_one_is_held_to_it() -> None:
    policy = RetryPolicy(initial=4.0, cap=60.0, jitter=1.0)
    assert policy.delay(1, draw=-2.0) == 0.0
    assert policy.delay(1, draw=7.0) == 4.0


@pytest.mark.parametrize("jitter", [-0.1, 1.5])
def test_jitter_outside_zero_to_one_is_refused(jitter: float) -> None:
    with pytest.raises(ValueError, match="jitter"):
        RetryPolicy(initial=1.0, jitter=jitter)


def test_due_waits_the_longest_wait_of_a_jittered_policy() -> None:
    policy = RetryPolicy(initial=10.0, cap=60.0, jitter=0.5)
    assert not policy.due(1, NOW, NOW + timedelta(seconds=9.9))
    assert policy.due(1, NOW, NOW + timedelta(seconds=10))
    assert policy.due(0, None, NOW)


@pytest.mark.parametrize(("retryable", "outside", "expected"), [
    (True, True, Blame.OUTSIDE), (False, True, Blame.OUTSIDE),
    (True, False, Blame.OWN), (False, False, Blame.PERMANENT)])
def test_blame_is_outside_first_then_retryable_or_permanent(retryable: bool, outside: bool,
                                                            expected: Blame) -> None:
    assert blame(retryable=retryable, outside=outside) is expected


# -- the outage probes (core.agent_faults) ------------------------------------------------

def test_an_outages_probes_double_from_outage_wait_to_the_cap() -> None:
    policy = outage_retry()
    assert [policy.delay(n) for n in range(1, 6)] == [10, 20, 30, 30, 30]
    assert outage_retry(timedelta(seconds=12)).delay(2) == 24


@given(wait_us=st.integers(min_value=29_297, max_value=120_000_000),
       streak=st.integers(min_value=-2, max_value=200))
def test_an_outages_wait_is_what_the_hand_rolled_backoff_gave(wait_us: int,
                                                              streak: int) -> None:
    """The formula agent_faults had (its exponent clamped at 10). From 29 297 µs up
    (30 s / 1024) the cap comes before the clamp; below it the old one never reached the
    cap its doc promised, and the policy does (the one change, a bug fixed)."""
    wait = timedelta(microseconds=wait_us)
    before = min(wait * 2 ** min(max(streak, 1) - 1, 10), OUTAGE_WAIT_CAP)
    fault = classify_stop_failure("overloaded", "529 Overloaded", NOW, outage_wait=wait,
                                  streak=streak)
    assert fault.until == NOW + before


def test_a_tiny_outage_wait_still_reaches_the_cap() -> None:
    fault = classify_stop_failure("overloaded", "", NOW, outage_wait=timedelta(
        milliseconds=1), streak=40)
    assert fault.until == NOW + OUTAGE_WAIT_CAP


# -- the Linear client ----------------------------------------------------------------------

def _client(draws: list[float], base: float = 2.0, cap: float = 60.0) -> LinearClient:
    return LinearClient(ApiKey("lin_test", "a test"), clock=lambda: NOW,
                        rng=iter(draws).__next__, backoff_base=base, backoff_cap=cap)


def _waited(client: LinearClient) -> float:
    assert client.backoff_until is not None
    return (client.backoff_until - NOW).total_seconds()


@pytest.mark.parametrize(("base", "cap"), [(2.0, 60.0), (0.5, 7.0)])
def test_linears_outage_backoff_is_what_the_hand_rolled_one_gave(base: float,
                                                                 cap: float) -> None:
    draws = [0.0, 0.25, 0.5, 0.75, 0.999, 0.1, 0.9, 0.3]
    client = _client(list(draws), base, cap)
    assert (client.backoff_base, client.backoff_cap) == (base, cap)
    for failures, draw in enumerate(draws, start=1):
        client._fail("a test outage")
        before = min(cap, base * 2 ** min(failures - 1, 30)) * (0.5 + 0.5 * draw)
        assert _waited(client) == pytest.approx(before, abs=1e-6)


def test_linears_rate_limit_waits_what_it_is_asked_plus_its_own_jitter() -> None:
    client = _client([0.2, 0.5])  # the backoff's draw first, then the rate wait's
    client._fail("rate limited", at_least=100.0, kind="rate")
    assert _waited(client) == pytest.approx(105.0)


def test_a_refused_key_is_retried_after_a_minute_doubling_to_half_an_hour() -> None:
    client = _client([])
    waits = []
    for _ in range(8):
        client._auth_error()
        waits.append(_waited(client))
    assert waits == [60, 120, 240, 480, 960, 1800, 1800, 1800]
    assert [AUTH_RETRY.delay(n) for n in (1, 6)] == [60, 1800]
