"""The groom role's settings and its rules, as pure functions.

A groom worker reads the project's open issues, trunk and recent events and,
through its own ``worker`` commands, proposes issues, changes priorities and
flags duplicates or stale issues. It acts on issues a person owns, so what it
may do is narrow and decided here, where a table test can check every case:

* a proposal is admitted within ``groom.proposals`` per run and, with the
  plans' issues, ``limits.plan_issues_per_hour``; it lands in a backlog state
  (a person moves it to a ready one) unless ``groom.auto_accept_per_day``
  still allows one more today;
* a priority may only move *down* (less urgent) on an issue whose priority is
  set, because a set priority is a person's; an issue with no priority, or one
  ralph-dev proposed and nobody accepted yet, may get any priority.
"""

from __future__ import annotations

from dataclasses import dataclass

from ralph_dev.core.errors import RalphError


@dataclass(frozen=True)
class GroomSettings:
    """When a groom worker runs (``[projects.NAME.groom]``); a person's ``ralph:groom``
    label asks for one at any time."""

    when_idle: bool = False
    """Groom when workers could start but no issue is ready."""
    interval: float = 0.0
    """Seconds between groom runs however busy the swarm is; 0 = never by the clock."""
    min_interval: float = 3600.0
    """Seconds at least between two groom runs ralph-dev starts by itself."""
    proposals: int = 10
    """The most issues one groom run may propose."""
    auto_accept_per_day: int = 0
    """Proposals per day created straight in a ready state (dispatched without a person);
    the rest wait in a backlog state."""


PRIORITY_NAMES = {0: "no priority", 1: "urgent", 2: "high", 3: "medium", 4: "low"}
"""Linear's scale: 0 = none, 1 = urgent … 4 = low."""


class GroomRefused(RalphError):
    """A groom command breaks a rule; the message says which and what to do instead."""


def check_priority_change(current: int, new: int, *, proposed: bool) -> None:
    """Raise :class:`GroomRefused` unless groom may move an issue from ``current`` to ``new``.

    ``proposed``: the issue carries the proposed label (ralph-dev made it and no person
    accepted it yet), so its priority is ralph-dev's own.
    """
    if new not in (1, 2, 3, 4):
        raise GroomRefused(f"priority {new!r} is not one of 1 (urgent), 2 (high), 3 (medium), "
                           "4 (low)")
    if current in (1, 2, 3, 4) and new < current and not proposed:
        raise GroomRefused(
            f"the issue's priority is {PRIORITY_NAMES[current]}, set by a person; a groom "
            f"worker may lower it but not raise it to {PRIORITY_NAMES[new]}. If it should be "
            "more urgent, say why with `ralph-dev worker flag … --reason` for a person")


def admit_proposal(*, this_run: int, per_run: int, last_hour: int, per_hour: int) -> None:
    """Raise :class:`GroomRefused` unless one more proposal may be created now.

    ``this_run``: proposals this groom run made so far; ``last_hour``: issues plans and
    groom runs created in the last hour (the plans' hourly cap counts both).
    """
    if this_run >= per_run:
        raise GroomRefused(
            f"this groom run proposed {this_run} issues already, the most one run may "
            "(groom.proposals): keep the most important ones and finish with `worker done`")
    if last_hour >= per_hour:
        raise GroomRefused(
            f"plans and groom runs created {last_hour} issues in the last hour, the most "
            f"allowed (limits.plan_issues_per_hour = {per_hour}): mention the rest in your "
            "done summary; a person can raise the limit")


def auto_accepts(accepted_last_day: int, per_day: int) -> bool:
    """A proposal goes straight to a ready state while today's allowance lasts."""
    return accepted_last_day < per_day
