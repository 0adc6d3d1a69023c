"""How each action of a plan is to be carried out, filled in once the rules chose it.

The rules say *what* happens to an issue; what the actuator needs beyond that (the
session a start resumes, whether the issue moves to its started state, whether an
ended worker's work comes in, what a forget keeps) follows from the same observed
facts, and is filled in here, in one place, so the actuator only acts. The plan's
order is set here too: the issues being merged go last, since a merge takes jj a
while and new workers should not wait for it (merging holds no slot); each issue's
own chain keeps its order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ralph_dev.core.actions import (
    Action,
    Forget,
    Kill,
    Merge,
    Reap,
    Restart,
    Spawn,
    Stop,
    VerifyMerge,
)
from ralph_dev.core.agent_profiles import PROFILES, role_cli, role_model
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.model import Observed, StateType, WorkerRecord

NOT_STARTED = (StateType.UNSTARTED, StateType.BACKLOG, StateType.TRIAGE)

SESSION_GONE = "the earlier session's transcript is gone"


def _fresh_why(rec: WorkerRecord) -> str:
    if rec.node:
        return (f"the earlier session's transcript did not come back from "
                f"{rec.host or 'its host'} (lost before its attempt ended)")
    return SESSION_GONE


def _start(action: Spawn | Restart, observed: Observed, rec: WorkerRecord | None,
           alive: bool, settings: ProjectSettings) -> Spawn | Restart:
    issue = next((i for i in observed.issues if i.identifier == action.issue), None)
    start_issue = issue is not None and issue.state_type in NOT_STARTED
    resume, fresh_why = None, ""
    cli = role_cli(settings, action.role)
    resumable = cli in PROFILES and PROFILES[cli].resumes
    if resumable and rec is not None and rec.session_id is not None \
            and rec.role is action.role:
        # a restart on another host keeps its transcript as it ends, just before it starts
        ends_first = isinstance(action, Restart) and alive and bool(rec.node)
        if action.issue in observed.sessions_kept or ends_first:
            resume = rec.session_id
        else:
            fresh_why = _fresh_why(rec)
    return dataclasses.replace(action, start_issue=start_issue, resume=resume,
                               fresh_why=fresh_why, cli=cli,
                               model=action.model or role_model(settings, action.role))


def fill(actions: Sequence[Action], observed: Observed, settings: ProjectSettings
         ) -> tuple[Action, ...]:
    """The plan's actions with how each is carried out, in the order they go."""
    alive = {w.name for w in observed.windows if w.alive}
    filled: list[Action] = []
    for action in actions:
        rec = observed.records.get(action.issue)
        if isinstance(action, Spawn | Restart):
            action = _start(action, observed, rec, action.issue in alive, settings)
        if isinstance(action, Kill | Restart | Reap | Stop) and rec is not None:
            action = dataclasses.replace(action, bring_in=rec.done and rec.role.may_edit)
        if isinstance(action, Merge) and rec is not None and rec.node and not action.run:
            action = dataclasses.replace(action, fetch_attempt=rec.host_attempt)
        if isinstance(action, VerifyMerge):
            # work done on other hosts comes in before the lane rebases it (a batch's
            # verify, not its landing: what lands is what was verified)
            action = dataclasses.replace(action, fetch=tuple(
                (name, r.host_attempt) for name in action.batch
                if (r := observed.records.get(name)) is not None and r.node))
        if isinstance(action, Forget):
            # in pull-request mode the change lives on under its pushed bookmark
            action = dataclasses.replace(
                action, keep_newest_push=action.keep_bookmark,
                keep_bookmark=action.keep_bookmark or settings.merge.mode == "pr")
        filled.append(action)
    merging = {a.issue for a in filled if isinstance(a, Merge)}
    return tuple(sorted(filled, key=lambda a: a.issue in merging))  # stable
