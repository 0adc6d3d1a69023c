"""The executor contract: what carrying out each action leaves behind, as a table.

``decide`` is pure and level-triggered, so its rules rely on the actuator
(``control.loop.act``) leaving the world as written here; otherwise a later tick would
repeat an action or miss one. What an action leaves in the worker record is the
action's own ``record_changes`` (the actuator writes exactly that, in production);
this table says the rest — windows, the issue's state and labels, the workspace,
comments, typed text, pauses — and is checked twice:

* :func:`apply` plays a plan on an ``Observed`` the way a fully successful actuator
  would; the property tests use it to show that deciding again repeats nothing;
* tests/test_executor_contract.py runs the real actuator for every action kind on
  a real tmux server, jj repo and tracker and checks each :class:`Effect`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from ralph_dev.core.actions import (
    Action,
    Adopt,
    Complete,
    Continue,
    EndPause,
    Forget,
    Hold,
    Kill,
    Merge,
    Nudge,
    OpenGroom,
    PassFeedback,
    PauseSwarm,
    Plan,
    ProbeAccount,
    Reap,
    Redo,
    Restart,
    Resume,
    SendBack,
    Spawn,
    Stop,
    Tell,
    TrunkVerified,
    VerifyMerge,
    VerifyTrunk,
    Waited,
    WriteBack,
)
from ralph_dev.core.config import Labels
from ralph_dev.core.model import (
    Comment,
    Issue,
    LaneRun,
    Observed,
    Pause,
    Probe,
    StateType,
    Window,
    WorkerRecord,
)


@dataclass(frozen=True)
class Effect:
    """What one successful action leaves behind, as the next tick observes it."""

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
    pause: Literal["started", "ended"] | None = None
    written_back: bool = False
    """The report's owed tracker writes are made (its item is gone)."""
    issue_created: bool = False
    lane: Literal["merge", "trunk", "over"] | None = None
    """merge/trunk: the merge lane's verify of the batch (of trunk) runs beside the loop;
    over: trunk's verify ended, its run is gone and trunk is red or green as it said."""
    sent_back: bool = False
    """The record holds the verify output the change went back with (``sent_back``)."""
    account_probed: bool = False
    """The account's key limits were asked for now (its claim written): no project on it
    asks again within the minute (``Observed.account_probed_at``)."""


EXECUTOR_CONTRACT: Mapping[type[Action], Effect] = {
    Spawn: Effect(window_opened=True, started=True, workspace="present"),
    Restart: Effect(window_opened=True, started=True, workspace="present"),
    Nudge: Effect(typed=True),
    Reap: Effect(windows_killed=True),
    Kill: Effect(windows_killed=True),
    Stop: Effect(windows_killed=True),
    Merge: Effect(workspace="merged"),
    Forget: Effect(workspace="gone"),
    Hold: Effect(labels_added=("user_input_needed",), comments=True),
    Complete: Effect(issue_state=StateType.COMPLETED),
    PassFeedback: Effect(typed=True, labels_removed=("user_feedback_given", "user_input_needed")),
    Resume: Effect(labels_removed=("user_feedback_given", "user_input_needed")),
    Tell: Effect(comments=True),
    Continue: Effect(typed=True),
    Waited: Effect(),
    Redo: Effect(),
    Adopt: Effect(),
    WriteBack: Effect(written_back=True, comments=True),
    PauseSwarm: Effect(pause="started"),
    EndPause: Effect(pause="ended"),
    VerifyTrunk: Effect(lane="trunk"),
    VerifyMerge: Effect(lane="merge"),
    SendBack: Effect(comments=True, sent_back=True),
    TrunkVerified: Effect(lane="over"),
    OpenGroom: Effect(issue_created=True),
    ProbeAccount: Effect(account_probed=True),
}


def apply(plan: Plan, observed: Observed, now: datetime, labels: Labels) -> Observed:
    """The world a fully successful actuator leaves after ``plan`` (tests use it)."""
    issues = {i.identifier: i for i in observed.issues}
    windows = list(observed.windows)
    spaces = {w.name: w for w in observed.workspaces}
    records = dict(observed.records)
    pauses = {p.kind: p for p in observed.pauses}
    owed = {o.id: o for o in observed.owed}
    unadopted = set(observed.unadopted)
    lane, due = observed.lane, observed.trunk_due
    probed = observed.account_probed_at
    red, red_at, trunk = observed.trunk_red, observed.trunk_red_at, observed.trunk_head
    for action in plan.actions:
        ident = action.issue
        effect = EXECUTOR_CONTRACT[type(action)]
        if effect.windows_killed or effect.window_opened:
            windows = [w for w in windows if w.name != ident]
        if effect.window_opened:
            windows.append(Window(name=ident, pane_id="%0", window_id="@0", alive=True,
                                  output_changed_at=now, last_activity=now))
        if action.record_deleted:
            records.pop(ident, None)
        elif changes := action.record_changes(now):
            base = records.get(ident) or WorkerRecord(issue=ident)
            records[ident] = dataclasses.replace(base, **changes)
        if ident in issues:
            issues[ident] = _issue_after(issues[ident], effect, labels)
        if isinstance(action, Tell) and ident in issues:
            said = Comment("ralph-dev", action.comment, now, by_ralph=True)
            issues[ident] = dataclasses.replace(issues[ident],
                                                comments=(*issues[ident].comments, said))
        if effect.workspace == "gone":
            spaces.pop(ident, None)
        elif effect.workspace == "merged" and ident in spaces:
            spaces[ident] = dataclasses.replace(spaces[ident], has_unmerged_change=False)
        if isinstance(action, PauseSwarm):
            pauses[action.pause_kind] = Pause(kind=action.pause_kind, cause=action.cause,
                                              fix=action.fix, since=now, until=action.until,
                                              quiet_workers=action.quiet_workers)
        if isinstance(action, EndPause):
            pauses.pop(action.pause_kind, None)
        if isinstance(action, WriteBack):
            owed.pop(action.report, None)
        unadopted.discard(ident if isinstance(action, Adopt) else "")
        if isinstance(action, VerifyMerge):
            lane = LaneRun(id=f"run-{len(plan.actions)}", kind="merge", state="running",
                           base=action.base or trunk or "", batch=action.batch,
                           size=action.size, good=action.good, bad=action.bad, started_at=now,
                           also=tuple(Probe(size, f"run-{len(plan.actions)}-{size}", "running")
                                      for size in action.also))
        if isinstance(action, VerifyTrunk):
            lane = LaneRun(id="trunk-run", kind="trunk", state="running", base=action.commit,
                           after=action.after, started_at=now)
            due = ()
        if isinstance(action, TrunkVerified):
            lane, red, red_at = None, not action.ok, None if action.ok else action.commit
        if isinstance(action, SendBack):
            records[ident] = dataclasses.replace(records[ident], sent_back="(its output)")
        if effect.account_probed:
            probed = now
        if isinstance(action, Merge) and action.run and trunk is not None:
            trunk = f"{trunk}+{ident}"  # the batch landed: trunk moved
    return dataclasses.replace(observed, issues=tuple(issues.values()), windows=tuple(windows),
                               workspaces=tuple(spaces.values()), records=records,
                               pauses=tuple(pauses.values()), owed=tuple(owed.values()),
                               unadopted=frozenset(unadopted), lane=lane, trunk_due=due,
                               trunk_red=red, trunk_red_at=red_at, trunk_head=trunk,
                               account_probed_at=probed)


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
