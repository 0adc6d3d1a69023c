"""Whether a plan worker's plan may be created: its size, its rate, its labels.

A plan comes from an agent that reads text anyone can write, so it is held to
limits a person set: at most ``limits.plan_issues`` issues in one plan and
``limits.plan_issues_per_hour`` created by plans in any hour (one plan worker
once made 5,000 sub-issues in a second), and no label that steers ralph-dev on
a person's behalf (a plan that labels its tasks ``user-feedback-given`` would
have them resumed as if a person had answered). Pure: the caller counts.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from ralph_dev.core.errors import RalphError
from ralph_dev.core.model import NewIssue


class PlanRefused(RalphError):
    """The plan breaks a limit; the message says which and what to do instead."""


def admit_plan(entries: Sequence[NewIssue], *, per_plan: int, per_hour: int,
               created_last_hour: int, person_only_labels: Collection[str]) -> None:
    """Raise :class:`PlanRefused` unless ``entries`` may be created now."""
    if len(entries) > per_plan:
        raise PlanRefused(
            f"the plan has {len(entries)} tasks; at most {per_plan} may be created by one plan "
            "(limits.plan_issues): group the work into fewer, larger tasks, or into phases "
            "(a phase is planned on its own later)")
    if created_last_hour + len(entries) > per_hour:
        raise PlanRefused(
            f"plans created {created_last_hour} issues in the last hour and this one adds "
            f"{len(entries)}; at most {per_hour} an hour (limits.plan_issues_per_hour): "
            "say so with `ralph-dev worker note` and finish; a person can raise the limit")
    reserved = {label.casefold() for label in person_only_labels}
    for entry in entries:
        for label in entry.labels:
            if label.casefold() in reserved:
                raise PlanRefused(
                    f"task {entry.ref or entry.title!r} has the label {label!r}, which only a "
                    "person may set (it steers ralph-dev): remove it from the plan")
