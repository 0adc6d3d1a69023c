"""What each worker report writes to the tracker, and how a write already made is found.

The actuator makes a report's writes after reading the issue again, and every write is
found before it is made — a comment by the mark it starts with, a state or a label
already there, a proposal by the mark in its description, a plan by its sub-issues —
so a controller killed between two writes repeats nothing. These are the texts, the
marks and the targets; the actuator (``control.act``) makes the calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.groom import PRIORITY_NAMES
from ralph_dev.core.model import Comment, Issue, Role, StateType
from ralph_dev.core.text import output_block, strip_ansi

DONE_MARK = "[ralph-dev] {issue} done"
BLOCKED_MARK = "[ralph-dev] {issue} blocked: a question for a person"
NOTE_MARK = "[ralph-dev] {issue} note"
GROOM_MARK = "[ralph-dev] groom run {issue} ({id})"
"""Starts every comment (and ends every proposal's description) a groom report writes."""

KINDS = frozenset({"done", "blocked", "note", "plan", "propose", "prioritize", "flag"})
"""Reports that write to the tracker (the others only change ralph-dev's own state)."""


def done_target(settings: ProjectSettings, role: Role) -> tuple[str | None, StateType | None]:
    """(state name, state type) a ``done`` report moves the issue to; (None, None) = stay.

    Only an execute worker's done with a review step after it moves its issue (to the
    review state: a reviewer takes it from there). Every other done leaves the state
    alone: an issue is completed once its change is in trunk (``completes_on_merge``),
    never before, so the tracker never says Done for work that did not land.
    """
    if role is Role.EXECUTE and settings.review_after_execute:
        return settings.review_state, None
    return None, None


def completes_on_merge(settings: ProjectSettings, role: Role) -> bool:
    """Whether the issue is completed once a done worker's change is in trunk (or, for a
    role that changes no code, once its workspace is put away). A plan worker's issue
    becomes a parent, completed when its children are; an execute worker's with a
    review step goes to review instead."""
    return role is not Role.PLAN and not (role is Role.EXECUTE and settings.review_after_execute)


ACTIVE = (StateType.UNSTARTED, StateType.STARTED)
"""The states whose issues are worked on. A person's move to any other unfinished state
(Backlog, Triage) means "not now": its worker is stopped and its change not merged."""


def kept_comment(issue: str, state: str) -> str:
    """Said under a done report for an issue a person moved out of the active states."""
    return (f"The issue is in {state!r}, so its change is kept in {issue}'s workspace and not "
            f"merged, and its state is left alone. Move it back to a ready or started state to "
            "have ralph-dev merge it.")


def in_state(issue: Issue, name: str | None, type_: StateType | None) -> bool:
    if name is not None:
        return issue.state_name.casefold() == name.casefold()
    if type_ is not None:
        return issue.state_type is type_
    return True


def evidence_comment(issue: str, role: Role, summary: str, verify: Mapping[str, Any] | None,
                     verify_command: str | None, finished: datetime,
                     spent: Mapping[str, Any] | None = None) -> str:
    """The ``done`` comment: the worker's summary, the verify run's evidence and what
    the issue's agents spent so far (when their transcripts said)."""
    lines = [f"{DONE_MARK.format(issue=issue)} ({role.value} worker)", "",
             strip_ansi(summary).strip(), ""]
    if verify is None:
        why = ("no verify command is configured" if not verify_command
               else f"the {role.value} role does not run the verify command")
        lines.append(f"Evidence: none ({why}); finished {finished:%Y-%m-%dT%H:%M:%SZ}.")
    else:
        lines += [
            f"Evidence: `{strip_ansi(str(verify.get('command', '')))}` exited "
            f"{verify.get('exit_code')} at {verify.get('started_at')} UTC after "
            f"{float(verify.get('duration_s') or 0):.1f} s.",
            "Output (last lines):", output_block(str(verify.get("output_tail", ""))),
        ]
    if spent:
        lines.append(f"Spent so far: {spent.get('tokens', 0)} tokens, about "
                     f"${float(spent.get('usd', 0.0)):.2f} (estimated from list prices).")
    return "\n".join(lines) + "\n"


def said(issue: Issue, prefix: str, since: datetime | None = None) -> Comment | None:
    """ralph-dev's newest comment on ``issue`` starting with ``prefix`` (made since
    ``since``, when given): a write made before a restart is not made again."""
    for comment in reversed(issue.comments):
        if comment.by_ralph and comment.body.startswith(prefix) and (
                since is None or comment.created_at is None or comment.created_at >= since):
            return comment
    return None


def report_comment(mark: str, issue: str, text: str) -> str:
    """A ``blocked`` or ``note`` comment: its mark, then the worker's words."""
    return f"{mark.format(issue=issue)}\n\n{strip_ansi(text).strip()}\n"


def groom_mark(issue: str, report: str) -> str:
    return GROOM_MARK.format(issue=issue, id=report)


def proposal_comment(mark: str, reason: str, ready: bool) -> str:
    then = ("accepted by itself (groom.auto_accept_per_day): it is dispatched like any "
            "ready issue" if ready else "it waits in the backlog until a person moves it "
            "to a ready state (or cancels it)")
    return f"{mark}: proposed: {reason}\n\n{then.capitalize()}.\n"


def priority_comment(mark: str, was: int, new: int, reason: str) -> str:
    return f"{mark}: priority {PRIORITY_NAMES[was]} → {PRIORITY_NAMES[new]}: {reason}\n"


def flag_comment(mark: str, duplicate_of: str | None, reason: str) -> tuple[str, str]:
    """(what the flag says, its comment)."""
    what = f"possible duplicate of {duplicate_of}" if duplicate_of else "looks stale"
    return what, f"{mark}: {what}: {reason}\n"
