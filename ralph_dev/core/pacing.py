"""Pacing an account's usage windows: new workers wait before a window runs out.

A subscriber's account has a five-hour and a seven-day window; every model answer
states how much of each is used and when it starts over (``UsageWindow``). An API key
has per-minute limits instead (requests, tokens), read by asking the API
(``adapters.api_probe``). Past a reserve the person keeps for their own use
(``[accounts.NAME] reserve``), a window is spent: no new worker starts until it resets.
Before that, starts are slowed so the window lasts until its reset: once more than half
of what the swarm may use is gone, a new worker waits while the window is used faster
than time passes in it. An API key's limits fill again within minutes, so they are not
spread: past the reserve, new workers wait until the limit is full again. Running
workers are never stopped by pacing; it only decides when the next one starts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from ralph_dev.core.model import UsageWindow

KEY_WINDOWS = ("requests", "tokens", "input_tokens", "output_tokens")
"""An API key's limits (``anthropic-ratelimit-<name>-*``), each refilled over a minute."""
WINDOW_LENGTHS = {"five_hour": timedelta(hours=5), "seven_day": timedelta(days=7),
                  **dict.fromkeys(KEY_WINDOWS, timedelta(minutes=1))}
WINDOW_NAMES = {"five_hour": "5-hour", "seven_day": "7-day", "requests": "requests/min",
                "tokens": "tokens/min", "input_tokens": "input tokens/min",
                "output_tokens": "output tokens/min"}
"""Each window's name as a person reads it (``status``, the dashboard, pacing's words)."""
KEY_PROBE_EVERY = timedelta(minutes=1)
"""How often an API key's limits are asked for while issues wait to start, whatever the
number of projects on the account (a one-token request each time)."""
FREE_SHARE = 0.5
"""Below this share of what the swarm may use of a window, starts are not slowed: a
window's start is not paced by the first few calls in it."""


@dataclass(frozen=True)
class PaceHold:
    """New workers wait until ``until`` because of ``window``."""

    window: UsageWindow
    until: datetime
    why: str


def pace(windows: Iterable[UsageWindow], reserve: float, now: datetime) -> PaceHold | None:
    """Whether the account's windows hold new workers back now, and until when (the
    longest hold of any window); None when they may start."""
    allowed = max(0.0, 1.0 - reserve)
    longest: PaceHold | None = None
    for window in windows:
        length = WINDOW_LENGTHS.get(window.name)
        if length is None or window.resets_at <= now:
            continue  # a window that has started over says nothing until it is read again
        name = f"the account's {WINDOW_NAMES[window.name]} window"
        kept = f"{reserve:.0%} kept for your own use"
        if window.used >= allowed:
            hold = PaceHold(window, window.resets_at,
                            f"{name} is {window.used:.0%} used ({kept}): new workers start "
                            "again at its reset")
        elif window.used < allowed * FREE_SHARE or window.name in KEY_WINDOWS:
            continue  # (a key's limit fills again within minutes: nothing to spread)
        else:
            # the moment the share of the window gone catches up with the share used
            due = window.resets_at - length * (1.0 - window.used / allowed)
            if due <= now:
                continue
            gone = 1.0 - (window.resets_at - now) / length
            hold = PaceHold(window, due,
                            f"{name} is {window.used:.0%} used with {max(gone, 0.0):.0%} of "
                            f"it gone ({kept}): new workers wait so it lasts until its reset")
        if longest is None or hold.until > longest.until:
            longest = hold
    return longest
