"""What an agent's failed turn means for the swarm (Claude Code's ``StopFailure`` hook).

Claude Code ends a turn on an API error with ``StopFailure`` (``error`` is one of
``rate_limit``, ``overloaded``, ``server_error``, ``authentication_failed``,
``billing_error``…; the text is its ``last_assistant_message``). None of these is
the issue's fault, so none may cost an attempt or a hold:

* a subscription usage limit ("You've hit your session limit · resets 3:06am
  (UTC)") pauses dispatch until the stated reset;
* a rate limit or an overloaded/erroring API pauses it for a backoff;
* a refused key or billing pauses it, tried again every half hour, until a
  person fixes it.

Waiting workers are not nudged or restarted meanwhile (``quiet_workers``); when
the pause ends they are told to continue in their own sessions. Measured on
Claude Code 2.1.197: no reset time is exposed except in the text, which gives the
time of day (the date too for weekly limits) and the time zone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

USAGE_LIMIT = "usage-limit"
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
"""The text states the reset to the minute: wait until a little after it."""
UNKNOWN_RESET_WAIT = timedelta(minutes=30)

_LIMIT = re.compile(r"hit your (?P<what>[\w -]*?)limit", re.IGNORECASE)
_RESET = re.compile(
    r"resets\s+(?:(?P<month>[A-Z][a-z]{2})\s+(?P<day>\d{1,2}),\s*)?"
    r"(?P<hour>\d{1,2})(?::(?P<minute>\d{2}))?\s*(?P<ampm>am|pm)\s*(?:\((?P<zone>[^)]+)\))?",
    re.IGNORECASE)
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")


@dataclass(frozen=True)
class AgentFault:
    kind: str
    """USAGE_LIMIT, API_OUTAGE or API_ACCESS: the pause it causes."""
    cause: str
    fix: str
    until: datetime
    """When the pause ends by itself (and the waiting workers are told to go on)."""


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
        when = local_now.replace(month=_MONTHS.index(month) + 1, day=int(found["day"]),
                                 hour=hour, minute=minute, second=0, microsecond=0)
        if when < local_now - timedelta(days=1):
            when = when.replace(year=when.year + 1)
    else:
        when = local_now.replace(hour=hour, minute=minute, second=0, microsecond=0)
        if when <= local_now - timedelta(minutes=1):
            when += timedelta(days=1)
    return when.astimezone(UTC)


def classify_stop_failure(error: str, text: str, now: datetime, *,
                          outage_wait: timedelta = OUTAGE_WAIT, streak: int = 1) -> AgentFault:
    """The swarm-wide pause one ``StopFailure`` calls for. An outage's wait doubles with
    each error in a row (``streak``), up to half an hour."""
    shown = " ".join(text.split())[:200]
    if error == "rate_limit" and _LIMIT.search(text):
        reset = usage_limit_reset(text, now)
        # the stated minute may already be over while the limit still holds: then a
        # minute more, never a pause that has ended before it began
        until = max(reset + RESET_MARGIN, now + timedelta(minutes=1)) if reset \
            else now + UNKNOWN_RESET_WAIT
        return AgentFault(USAGE_LIMIT, f"the model's usage limit was reached: {shown}",
                          "nothing: dispatch resumes and waiting workers continue at the "
                          "reset (or raise the plan's limit)", until)
    if error in ("authentication_failed", "oauth_org_not_allowed", "billing_error"):
        return AgentFault(API_ACCESS, f"the model API refused the agent's access ({error}): "
                                      f"{shown}",
                          "check ANTHROPIC_API_KEY or the Claude login and billing; ralph-dev "
                          "tries again every 30 minutes", now + UNKNOWN_RESET_WAIT)
    wait = min(outage_wait * 2 ** min(max(streak, 1) - 1, 10), OUTAGE_WAIT_CAP)
    return AgentFault(API_OUTAGE, f"the model API failed ({error or 'unknown'}): {shown}",
                      "nothing: dispatch resumes and waiting workers continue after a wait",
                      now + wait)
