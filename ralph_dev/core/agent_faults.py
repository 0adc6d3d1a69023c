"""What an agent's failed turn means for the swarm (Claude Code's ``StopFailure`` hook).

Claude Code ends a turn on an API error with ``StopFailure`` (``error`` is one of
``rate_limit``, ``overloaded``, ``server_error``, ``authentication_failed``,
``billing_error``…; the text is its ``last_assistant_message``). None of these is
the issue's fault, so none may cost an attempt or a hold:

* a usage or rate limit pauses dispatch until it lifts: a subscription's limit until
  the reset its text states ("You've hit your session limit · resets 3:06am (UTC)"),
  an API key's rate limit until the reset the API gave (``retry-after``), read by the
  hook (the CLI passes it on nowhere), or, when that could not be read, for a backoff;
* an overloaded or erroring API pauses it for a backoff;
* a refused key or billing pauses it, tried again every half hour, until a
  person fixes it.

Waiting workers are not nudged or restarted meanwhile (``quiet_workers``); when
the pause ends they are told to continue in their own sessions. What Claude Code
2.1.197 exposes, and how that was checked: docs/claude-code-limits.md.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ralph_dev.core.policy import RetryPolicy

USAGE_LIMIT = "usage-limit"
RATE_LIMIT = "rate-limit"
"""An API key's rate limit whose end could not be read: a backoff, said as a limit."""
API_OUTAGE = "api-outage"
API_ACCESS = "api-access"

OUTAGE_WAIT = timedelta(seconds=10)
"""A rate limit or overload without a stated end: Claude Code already retried for
minutes before giving up; the first probe goes out after this, each next one after
twice the last, up to ``OUTAGE_WAIT_CAP``."""
OUTAGE_WAIT_CAP = timedelta(seconds=30)
"""The longest step between an outage's probes: the API's recovery is noticed within it
(and within Claude Code's own retries while a probe is out), at one worker's calls a step."""
RESET_MARGIN = timedelta(seconds=30)
"""An API key's 429 whose reset could not be read is waited out this much past what
Claude Code already waited by itself."""
PROBE_STEP = timedelta(seconds=3)
"""How soon a limit that still refuses at or after its reset is asked again. A stated
reset is resumed at, not after: the API's own is exact, but clocks differ, and Claude
Code states a subscriber's to the minute, cut (9:51:33 → "9:51pm"), so the limit may
lift up to a minute later. Until it does, one worker's session asks again each step
(``AgentFault.probe``): a refused request costs nothing and charges no attempt, and the
swarm goes on within a step of the real reset."""
CLI_OWN_WAIT = timedelta(seconds=60)
"""Claude Code waits out a ``retry-after`` of up to a minute by itself; it gives up at
once on a longer one. A 429 that ended the turn therefore asked for more than this."""
UNKNOWN_RESET_WAIT = timedelta(minutes=30)


def outage_retry(outage_wait: timedelta = OUTAGE_WAIT) -> RetryPolicy:
    """An outage's probes (``timing.outage_wait``): the first after ``outage_wait``, each
    next one after twice the last, up to ``OUTAGE_WAIT_CAP``. An outage is outside the
    issue, so nothing is ever exhausted: ``max_attempts`` plays no part."""
    return RetryPolicy(initial=outage_wait.total_seconds(), backoff=2.0,
                       cap=OUTAGE_WAIT_CAP.total_seconds())

_LIMIT = re.compile(r"hit your (?P<what>[\w -]*?)limit", re.IGNORECASE)
_RESET = re.compile(
    r"(?:resets|try again at)\s+(?:(?P<month>[A-Z][a-z]{2})[a-z]*\s+(?P<day>\d{1,2})"
    r"(?:st|nd|rd|th)?,\s*(?:(?P<year>\d{4})\s+)?)?"
    r"(?P<hour>\d{1,2})(?::(?P<minute>\d{2}))?\s*(?P<ampm>am|pm)\s*(?:\((?P<zone>[^)]+)\))?",
    re.IGNORECASE)
"""Claude Code's "resets 1pm (UTC)", "resets Dec 3, 9am (Europe/Berlin)"; Codex's "try
again at 2:23 AM", "try again at Nov 30th, 2026 2:23 AM" (its local time; its supervisor
adds the zone: ``inpane.codex_exec``)."""
_KEY_LIMIT = re.compile(r"Request rejected \(429\)", re.IGNORECASE)
"""How Claude Code words an API key's 429 (a subscriber's server-side throttle says
"Server is temporarily limiting requests (not your usage limit)": an outage)."""
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")


@dataclass(frozen=True)
class AgentFault:
    kind: str
    """USAGE_LIMIT, API_OUTAGE or API_ACCESS: the pause it causes."""
    cause: str
    fix: str
    until: datetime
    """When the pause ends by itself (and the waiting workers are told to go on)."""
    probe: bool = True
    """Its end is a guess (an outage's step, a reset stated to the minute, a limit that
    refused at its reset): then one worker's session asks the API first, and its answer
    ends the pause for everyone. False: the API stated the end, and everyone goes on
    then."""


def _zone(name: str | None) -> ZoneInfo:
    try:
        return ZoneInfo((name or "UTC").strip())
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def usage_limit_reset(text: str, now: datetime) -> datetime | None:
    """The reset a usage-limit text states, as an aware UTC time after ``now``."""
    found = _RESET.search(text)
    if found is None:
        return None
    hour = int(found["hour"]) % 12 + (12 if found["ampm"].lower() == "pm" else 0)
    minute = int(found["minute"] or 0)
    if hour > 23 or minute > 59:
        return None
    zone = _zone(found["zone"])
    local_now = now.astimezone(zone)
    if found["month"]:
        month = found["month"].lower()
        if month not in _MONTHS:
            return None
        try:
            when = local_now.replace(
                year=int(found["year"]) if found["year"] else local_now.year,
                month=_MONTHS.index(month) + 1, day=int(found["day"]), hour=hour,
                minute=minute, second=0, microsecond=0)
        except ValueError:  # no such day
            return None
        if not found["year"] and when < local_now - timedelta(days=1):
            when = when.replace(year=when.year + 1)
    else:
        when = local_now.replace(hour=hour, minute=minute, second=0, microsecond=0)
        if when <= local_now - timedelta(minutes=1):
            when += timedelta(days=1)
    return when.astimezone(UTC)


_RESETS = ("requests", "tokens", "input-tokens", "output-tokens")
"""The API key's limits whose ``anthropic-ratelimit-<name>-reset`` (RFC 3339) may say
when a 429 lifts."""


def reset_from_headers(headers: Mapping[str, str], now: datetime) -> datetime | None:
    """When a refused request may be sent again, as the API's 429 says: ``retry-after``
    (seconds or an HTTP date), else a subscription's ``anthropic-ratelimit-unified-reset``
    (Unix seconds), else the latest reset of a key's exhausted limit."""
    said = {k.lower(): v.strip() for k, v in headers.items()}
    retry = said.get("retry-after", "")
    if retry.isdigit():
        return now + timedelta(seconds=int(retry))
    if retry:
        with contextlib.suppress(TypeError, ValueError, IndexError):
            return parsedate_to_datetime(retry).astimezone(UTC)
    unified = said.get("anthropic-ratelimit-unified-reset", "")
    if unified.isdigit():
        return datetime.fromtimestamp(int(unified), UTC)
    resets = []
    for name in _RESETS:
        reset = said.get(f"anthropic-ratelimit-{name}-reset")
        if reset and said.get(f"anthropic-ratelimit-{name}-remaining") == "0":
            with contextlib.suppress(ValueError):
                when = datetime.fromisoformat(reset.replace("Z", "+00:00"))
                resets.append(when if when.tzinfo else when.replace(tzinfo=UTC))
    return max(resets, default=None)


def key_windows(headers: Mapping[str, str]) -> dict[str, tuple[float, datetime]]:
    """An API key's per-minute limits as an answer's headers state them
    (``anthropic-ratelimit-<name>-{limit,remaining,reset}``): each one's used share
    and when it is full again. A limit stated in part, or not as numbers, is left out."""
    said = {k.lower(): v.strip() for k, v in headers.items()}
    out: dict[str, tuple[float, datetime]] = {}
    for name in _RESETS:
        limit = said.get(f"anthropic-ratelimit-{name}-limit", "")
        remaining = said.get(f"anthropic-ratelimit-{name}-remaining", "")
        reset = said.get(f"anthropic-ratelimit-{name}-reset", "")
        if not (limit.isdigit() and remaining.isdigit() and int(limit) > 0 and reset):
            continue
        try:
            when = datetime.fromisoformat(reset.replace("Z", "+00:00"))
        except ValueError:
            continue
        used = 1.0 - min(int(remaining), int(limit)) / int(limit)
        out[name.replace("-", "_")] = (used, when if when.tzinfo else when.replace(tzinfo=UTC))
    return out


OPENAI_LIMITS = ("requests", "tokens")
"""An OpenAI key's per-minute limits (``x-ratelimit-{limit,remaining,reset}-<name>``)."""
_DURATION = re.compile(r"(?:(\d{1,5})h)?(?:(\d{1,5})m(?!s))?(?:(\d{1,5}(?:\.\d{1,6})?)s)?"
                       r"(?:(\d{1,7})ms)?")


def openai_key_windows(headers: Mapping[str, str], now: datetime
                       ) -> dict[str, tuple[float, datetime]]:
    """An OpenAI key's per-minute limits as an answer's headers state them: used share,
    and when full again (its reset is a duration from now: ``6m0s``, ``1.5s``, ``20ms``)."""
    said = {k.lower(): v.strip() for k, v in headers.items()}
    out: dict[str, tuple[float, datetime]] = {}
    for name in OPENAI_LIMITS:
        limit = said.get(f"x-ratelimit-limit-{name}", "")
        remaining = said.get(f"x-ratelimit-remaining-{name}", "")
        reset = _DURATION.fullmatch(said.get(f"x-ratelimit-reset-{name}", ""))
        if not (limit.isdigit() and remaining.isdigit() and int(limit) > 0) \
                or reset is None or not any(reset.groups()):
            continue
        hours, minutes, secs, millis = (float(g or 0) for g in reset.groups())
        after = timedelta(hours=hours, minutes=minutes, seconds=secs, milliseconds=millis)
        out[name] = (1.0 - min(int(remaining), int(limit)) / int(limit), now + after)
    return out


def is_key_rate_limit(error: str, text: str) -> bool:
    """An API key's 429 that Claude Code gave up on (its reset unsaid)."""
    return error == "rate_limit" and bool(_KEY_LIMIT.search(text))


_LIMIT_FIX = ("nothing: dispatch resumes and waiting workers continue at the reset (or raise "
              "the plan's or the key's limit)")


def classify_stop_failure(error: str, text: str, now: datetime, *,
                          outage_wait: timedelta = OUTAGE_WAIT, streak: int = 1,
                          reset_at: datetime | None = None) -> AgentFault:
    """The swarm-wide pause one ``StopFailure`` calls for. ``reset_at``: when the API said
    the limit lifts (its ``retry-after`` or reset headers, as the hook read them), the
    most exact source. An outage's wait doubles with each error in a row (``streak``),
    up to ``OUTAGE_WAIT_CAP`` (:func:`outage_retry`)."""
    shown = " ".join(text.split())[:200]
    backoff = timedelta(seconds=outage_retry(outage_wait).delay(max(streak, 1)))
    if error == "rate_limit" and reset_at is not None:
        # a reset already past that still refused: clocks differ, ask again shortly
        return AgentFault(USAGE_LIMIT, f"the API's rate limit was reached (its reset read from "
                                       f"the API's answer): {shown}", _LIMIT_FIX,
                          reset_at if reset_at > now else now + PROBE_STEP,
                          probe=reset_at <= now)
    if error == "rate_limit" and _LIMIT.search(text):
        reset = usage_limit_reset(text, now)
        # the stated minute is the earliest the limit lifts; a minute that is over while
        # the limit still holds is asked again a step later
        until = (reset if reset > now else now + PROBE_STEP) if reset \
            else now + UNKNOWN_RESET_WAIT
        return AgentFault(USAGE_LIMIT, f"the model's usage limit was reached: {shown}",
                          _LIMIT_FIX, until)
    if is_key_rate_limit(error, text):
        return AgentFault(RATE_LIMIT, f"the API key's rate limit was reached, its reset could "
                                      f"not be read: {shown}",
                          "nothing: dispatch resumes and waiting workers continue after a "
                          "wait (or raise the key's rate limit)",
                          now + max(backoff, CLI_OWN_WAIT + RESET_MARGIN))
    if error in ("authentication_failed", "oauth_org_not_allowed", "billing_error"):
        return AgentFault(API_ACCESS, f"the model API refused the agent's access ({error}): "
                                      f"{shown}",
                          "check the agent CLI's API key or login (ANTHROPIC_API_KEY, "
                          "OPENAI_API_KEY, …) and its billing; ralph-dev "
                          "tries again every 30 minutes", now + UNKNOWN_RESET_WAIT,
                          probe=False)
    return AgentFault(API_OUTAGE, f"the model API failed ({error or 'unknown'}): {shown}",
                      "nothing: dispatch resumes and waiting workers continue after a wait",
                      now + backoff)

