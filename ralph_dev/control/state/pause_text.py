"""How a swarm pause is said to a person, the same in ``status``, on the dashboard and
in its one notification. A limit is said by when it lifts ("usage limit until 14:05"),
in the reader's local time: that is what a person plans by, and what Claude Code
itself says to a subscriber."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from ralph_dev.core.agent_faults import RATE_LIMIT, USAGE_LIMIT
from ralph_dev.core.model import Pause


def clock(when: datetime, now: datetime) -> str:
    """Local HH:MM; the date too when it is not today."""
    local = when.astimezone()
    today = now.astimezone().date()
    return local.strftime("%H:%M") if local.date() == today else local.strftime("%Y-%m-%d %H:%M")


def limit_lifts(until: datetime) -> datetime:
    """The reset a limit's pause waits for (its end), up to the whole minute, as Claude
    Code says it to a subscriber."""
    whole = until.replace(second=0, microsecond=0)
    return whole if whole == until else whole + timedelta(minutes=1)


def pause_headline(kind: str, cause: str, until: datetime | None, now: datetime,
                   probe: str | None = None) -> str:
    """The pause in a few words: a limit by its reset, anything else by its cause; a
    pause whose end has come while one worker's session asks the API first, by that."""
    if probe is not None:
        what = "usage limit" if kind == USAGE_LIMIT else kind.replace("-", " ")
        return f"{what}: its end has come; {probe}'s session asks the model API first"
    if until is None:
        return cause
    if kind == USAGE_LIMIT:
        return f"usage limit until {clock(limit_lifts(until), now)}"
    if kind == RATE_LIMIT:
        return f"rate limit (the API key's reset unknown): trying again at {clock(until, now)}"
    return f"{cause}, until {clock(until, now)}"


def pause_entries(pauses: Iterable[Pause], now: datetime) -> list[dict[str, Any]]:
    """The state document's ``pauses``: each with its headline, and for a limit the
    reset it waits for (``lifts``), so the dashboard says it in the browser's zone."""
    return [{"kind": p.kind, "headline": pause_headline(p.kind, p.cause, p.until, now, p.probe),
             "cause": p.cause, "fix": p.fix,
             "since": p.since.isoformat() if p.since else None,
             "until": p.until.isoformat() if p.until else None,
             "lifts": limit_lifts(p.until).isoformat()
             if p.kind == USAGE_LIMIT and p.until and p.probe is None else None}
            for p in sorted(pauses, key=lambda p: p.kind)]
