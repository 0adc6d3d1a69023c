"""The tracker writes of a groom worker's reports, made by the relay exactly once.

Each write is found again before it is made: a proposal by the mark in its
description (the report's id), a comment by the mark it starts with; a priority
or a label already there is not written twice. A controller killed between two
writes repeats nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ralph_dev.adapters.store import StateStore
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.groom import PRIORITY_NAMES
from ralph_dev.core.model import NewIssue, StateType
from ralph_dev.core.ports import Tracker

if TYPE_CHECKING:
    from ralph_dev.control.relay import RelayItem

MARK = "[ralph-dev] groom run {issue} ({id})"
"""Starts every comment (and ends every proposal's description) a groom report writes."""


def _mark(item: RelayItem) -> str:
    return MARK.format(issue=item.issue, id=item.id)


async def _comment_once(tracker: Tracker, target: str, body: str, mark: str) -> None:
    issue = await tracker.get(target)
    if not any(c.by_ralph and c.body.startswith(mark) for c in issue.comments):
        await tracker.comment(target, body, by_ralph=True)


async def apply(settings: ProjectSettings, store: StateStore, tracker: Tracker,
                item: RelayItem) -> dict[str, Any]:
    body, mark = item.body, _mark(item)
    reason = str(body["reason"])
    if item.kind == "propose":
        ready = bool(body.get("ready"))
        found = [i for i in await tracker.list_issues() if mark in i.description]
        if found:
            created = found[0].identifier
        else:
            description = str(body.get("description", "")).strip()
            created = (await tracker.create_issues([NewIssue(
                title=str(body["title"]), priority=int(body.get("priority", 0)),
                description=f"{description}\n\nProposed by {mark}: {reason}".strip(),
                labels=(settings.labels.proposed,),
                state_type=None if ready else StateType.BACKLOG)]))[0]
            store.append_event("groom_proposed", issue=item.issue, created=[created],
                               ready=ready)
        then = ("accepted by itself (groom.auto_accept_per_day): it is dispatched like any "
                "ready issue" if ready else "it waits in the backlog until a person moves it "
                "to a ready state (or cancels it)")
        await _comment_once(tracker, created, f"{mark}: proposed: {reason}\n\n{then.capitalize()}."
                            "\n", mark)
        return {"created": created}
    target = str(body["target"])
    if item.kind == "prioritize":
        new, was = int(body["priority"]), int(body.get("was", 0))
        await tracker.set_priority(target, new)
        await _comment_once(tracker, target, f"{mark}: priority {PRIORITY_NAMES[was]} → "
                                             f"{PRIORITY_NAMES[new]}: {reason}\n", mark)
        return {"target": target, "priority": new}
    of = body.get("duplicate_of")
    what = f"possible duplicate of {of}" if of else "looks stale"
    await _comment_once(tracker, target, f"{mark}: {what}: {reason}\n", mark)
    issue = await tracker.get(target)
    if settings.labels.agent_feedback_given not in issue.labels:
        await tracker.add_labels(target, [settings.labels.agent_feedback_given])
    return {"target": target, "flag": what}
