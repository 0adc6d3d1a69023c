"""The executor contract: what carrying out each action leaves behind.

``decide`` is pure and level-triggered, so its rules rely on the executor
(``control.controller.Controller.act``) leaving the world and the worker
records exactly as written here; otherwise a later tick would repeat an
action or miss one. The contract is data, checked twice:

* :func:`apply` plays a plan on an ``Observed`` the way a fully successful
  executor would; the property tests use it to show that deciding again
  repeats nothing and that retries respect caps and backoff;
* tests/test_executor_contract.py runs the real controller's ``act`` for
  every action kind on a real tmux server, jj repo and tracker and checks
  each :class:`Effect` against what it finds.

How a plan is carried out besides: actions run in plan order; for one issue,
its chain stops at the first failing action (a later tick sees the world
again and retries). A finished worker's chain is Kill → Merge → Forget: the
window goes before jj touches the workspace, and the workspace goes only
after its change is in trunk (or, for a canceled issue, kept under a
bookmark). A Merge that conflicts leaves trunk alone and the record either
keeps its done marker or is reset with role ``resolve``: either way the
conflicted workspace gets a resolve worker.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from ralph_dev.core.config import Labels
from ralph_dev.core.model import (
    Action,
    Complete,
    Forget,
    Hold,
    Issue,
    Kill,
    Merge,
    Nudge,
    Observed,
    Plan,
    Reap,
    RelayFeedback,
    Restart,
    Resume,
    Spawn,
    StateType,
    Window,
    WorkerRecord,
)


@dataclass(frozen=True)
class FromAction:
    """A record field set to the action's own attribute (``Spawn.attempt`` → attempts)."""

    attribute: str


NOW = "<the time of the act>"
"""A record field set to the executor's clock when it acts."""

RecordValue = object
"""A literal value, :data:`NOW` or a :class:`FromAction`."""


@dataclass(frozen=True)
class Effect:
    """What one successful action leaves behind, as the next tick observes it."""

    record: Mapping[str, RecordValue] = field(default_factory=dict)
    """Worker-record fields the action sets (other fields keep their values; a missing
    record is started)."""
    record_deleted: bool = False
    windows_killed: bool = False
    """Every window with the issue's name is gone (names may repeat)."""
    window_opened: bool = False
    """One live window with the issue's name runs the worker."""
    started: bool = False
    """The issue is in a started state (moved there when it was unstarted)."""
    issue_state: StateType | None = None
    labels_added: tuple[str, ...] = ()
    """``Labels`` attribute names (``user_input_needed``…), not label texts."""
    labels_removed: tuple[str, ...] = ()
    workspace: Literal["present", "merged", "gone"] | None = None
    """present: the issue's workspace exists; merged: it holds nothing outside trunk;
    gone: forgotten and removed."""
    comments: bool = False
    """A ralph-dev comment on the issue says why."""
    typed: bool = False
    """A fixed text (never issue text) was typed into the live window."""


_SPAWN_RECORD: Mapping[str, RecordValue] = {
    "role": FromAction("role"), "attempts": FromAction("attempt"), "started_at": NOW,
    "done": False, "blocked": False, "nudged_at": None, "iterations": 0, "lost": None,
}

EXECUTOR_CONTRACT: Mapping[type[Action], Effect] = {
    Spawn: Effect(record=_SPAWN_RECORD, window_opened=True, started=True, workspace="present"),
    Restart: Effect(record={**_SPAWN_RECORD, "last_failure_at": NOW,
                            "last_failure": FromAction("reason")},
                    window_opened=True, started=True, workspace="present"),
    Nudge: Effect(record={"nudged_at": NOW}, typed=True),
    Reap: Effect(record={"last_failure_at": NOW, "last_failure": FromAction("reason")},
                 windows_killed=True),
    Kill: Effect(windows_killed=True),
    Merge: Effect(workspace="merged"),
    Forget: Effect(workspace="gone", record_deleted=True),
    Hold: Effect(labels_added=("user_input_needed",), comments=True),
    Complete: Effect(issue_state=StateType.COMPLETED),
    RelayFeedback: Effect(record={"blocked": False}, typed=True,
                          labels_removed=("user_feedback_given", "user_input_needed")),
    Resume: Effect(record={"attempts": 0, "blocked": False, "last_failure_at": None,
                           "nudged_at": None},
                   labels_removed=("user_feedback_given", "user_input_needed")),
}


def record_changes(action: Action, now: datetime) -> dict[str, Any]:
    """The record fields ``action`` sets, with NOW and FromAction resolved."""
    out: dict[str, Any] = {}
    for name, value in EXECUTOR_CONTRACT[type(action)].record.items():
        if value == NOW:
            out[name] = now
        elif isinstance(value, FromAction):
            out[name] = getattr(action, value.attribute)
        else:
            out[name] = value
    return out


def apply(plan: Plan, observed: Observed, now: datetime, labels: Labels) -> Observed:
    """The world a fully successful executor leaves after ``plan`` (tests use it)."""
    issues = {i.identifier: i for i in observed.issues}
    windows = list(observed.windows)
    spaces = {w.name: w for w in observed.workspaces}
    records = dict(observed.records)
    for action in plan.actions:
        ident = action.issue
        effect = EXECUTOR_CONTRACT[type(action)]
        if effect.windows_killed or effect.window_opened:
            windows = [w for w in windows if w.name != ident]
        if effect.window_opened:
            windows.append(Window(name=ident, pane_id="%0", window_id="@0", alive=True,
                                  output_changed_at=now, last_activity=now))
        if effect.record_deleted:
            records.pop(ident, None)
        elif effect.record:
            base = records.get(ident) or WorkerRecord(issue=ident)
            records[ident] = dataclasses.replace(base, **record_changes(action, now))
        if ident in issues:
            issues[ident] = _issue_after(issues[ident], effect, labels)
        if effect.workspace == "gone":
            spaces.pop(ident, None)
        elif effect.workspace == "merged" and ident in spaces:
            spaces[ident] = dataclasses.replace(spaces[ident], has_unmerged_change=False)
    return dataclasses.replace(observed, issues=tuple(issues.values()), windows=tuple(windows),
                               workspaces=tuple(spaces.values()), records=records)


def _issue_after(issue: Issue, effect: Effect, labels: Labels) -> Issue:
    if effect.started and issue.state_type != StateType.STARTED:
        issue = dataclasses.replace(issue, state_type=StateType.STARTED,
                                    state_name="In Progress")
    if effect.issue_state is not None:
        issue = dataclasses.replace(issue, state_type=effect.issue_state,
                                    state_name=effect.issue_state.value.title())
    added = {getattr(labels, name) for name in effect.labels_added}
    removed = {getattr(labels, name).casefold() for name in effect.labels_removed}
    if added or removed:
        kept = {label for label in issue.labels if label.casefold() not in removed}
        issue = dataclasses.replace(issue, labels=frozenset(kept | added))
    return issue
