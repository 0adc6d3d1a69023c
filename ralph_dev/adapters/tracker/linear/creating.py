"""Creating a batch of issues in Linear: parents first, then the "blocks" relations.

Linear has no transactions, so everything that can be checked is checked
before the first issue exists: the batch itself, cycles with the issues
already read, each entry's team and state. A failure after that names what
was created (``LinearPartialCreate``) so a person creates only the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from ralph_dev.adapters.tracker.batch import check_batch
from ralph_dev.adapters.tracker.linear.errors import LinearPartialCreate
from ralph_dev.adapters.tracker.linear.parse import (
    LinearState,
    LinearTeam,
    entry_from_node,
    parsing,
)
from ralph_dev.adapters.tracker.linear.reading import LinearReader
from ralph_dev.core.cycles import WAITS_FOR, batch_cycle, waits
from ralph_dev.core.errors import TrackerError, TrackerInputError
from ralph_dev.core.model import NewIssue

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class CreatePlan:
    """Where one new issue goes, decided for the whole batch before anything is created."""

    team: LinearTeam
    state: LinearState
    parent_id: str | None


def parents_first(entries: Sequence[NewIssue], refs: dict[str, int]) -> list[int]:
    """The order to create ``entries`` in: a parent named by ref before its sub-issues."""
    order: list[int] = []
    placed: set[int] = set()
    while len(order) < len(entries):
        progress = False
        for i, entry in enumerate(entries):
            parent_ref = refs.get(entry.parent or "")
            if i not in placed and (parent_ref is None or parent_ref in placed):
                order.append(i)
                placed.add(i)
                progress = True
        if not progress:
            raise TrackerInputError("parent refs form a cycle; nothing was created")
    return order


class LinearIssueCreator:
    """``create_issues`` of one Linear project, through the shared context."""

    def __init__(self, reader: LinearReader) -> None:
        self.reader = reader
        self.context = reader.context
        self.client = reader.client
        self.directory = reader.directory

    async def _plan_creates(self, entries: Sequence[NewIssue], refs: dict[str, int],
                            order: Sequence[int]) -> dict[int, CreatePlan]:
        """Team, state and parent of every entry, checked before anything is created."""
        project = await self.directory.project()
        plans: dict[int, CreatePlan] = {}
        for i in order:
            entry = entries[i]
            parent_id = None
            if entry.parent and entry.parent in refs:
                team = plans[refs[entry.parent]].team
            elif entry.parent:
                parent = await self.reader.get(entry.parent)
                parent_id = parent.id
                team = await self.context.team_of(parent)
            else:
                team = self.directory.team_for_new_issues(project)
            state = self.directory.state_for_new_issue(team, entry.state, entry.state_type)
            plans[i] = CreatePlan(team, state, parent_id)
        return plans

    async def create_issues(self, new: Sequence[NewIssue]) -> list[str]:
        """Create in parent-first order, then the "blocks" relations. Linear has no
        transactions: on failure ``LinearPartialCreate`` lists what was created."""
        entries = list(new)
        if not entries:
            return []
        refs = check_batch(entries)
        order = parents_first(entries, refs)
        project = await self.directory.project()
        cache = await self.context.open_cache()
        # What is cached (no request): a batch hangs under issues ralph-dev just read.
        cycle = batch_cycle(entries, *waits(cache.issues()))
        if cycle:
            raise TrackerInputError(f"dependency cycle {cycle} ({WAITS_FOR}); nothing was "
                                    "created")
        plans = await self._plan_creates(entries, refs, order)
        made: dict[int, tuple[str, str]] = {}  # index → (uuid, identifier)
        done: list[str] = []

        def failed(i: int, exc: Exception) -> LinearPartialCreate:
            created = ", ".join(done) or "none"
            return LinearPartialCreate(
                f"creating entry {i + 1} ({entries[i].title!r}) failed: {exc}; already created "
                f"in Linear: {created} (fix the problem, then create only the rest)", done)

        for i in order:
            entry, plan = entries[i], plans[i]
            try:
                parent_id = made[refs[entry.parent]][0] if entry.parent in refs else \
                    plan.parent_id
                payload: dict[str, Any] = {
                    "teamId": plan.team.id, "stateId": plan.state.id,
                    "title": entry.title.strip(), "description": entry.description,
                    "priority": entry.priority, "projectId": project.id,
                }
                if parent_id:
                    payload["parentId"] = parent_id
                if entry.labels:
                    payload["labelIds"] = await self.directory.label_ids(entry.labels, plan.team.id)
                data = await self.client.execute("IssueCreate", {"input": payload})
                with parsing("IssueCreate"):
                    created = entry_from_node(data["issueCreate"]["issue"])
                cache.store(created)
                made[i] = (created.id, created.identifier)
                done.append(created.identifier)
            except TrackerError as exc:
                if not done:
                    raise
                raise failed(i, exc) from None
        for i in order:
            for blocker in entries[i].blocked_by:
                try:
                    if blocker in refs:
                        blocker_id = made[refs[blocker]][0]
                    else:
                        blocker_id = (await self.reader.get(blocker)).id
                    await self.client.execute("IssueRelationCreate", {"input": {
                        "issueId": blocker_id, "relatedIssueId": made[i][0], "type": "blocks"}})
                except TrackerError as exc:
                    raise failed(i, exc) from None
        created_ids = [made[i][1] for i in range(len(entries))]
        log.info("linear_issues_created", count=len(created_ids), first=created_ids[0],
                 teams=sorted({plans[i].team.key for i in order}),
                 states=sorted({plans[i].state.name for i in order}))
        return created_ids
