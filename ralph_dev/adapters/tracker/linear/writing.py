"""Writing Linear: states, labels, priorities, comments and blockers of existing issues.

Each write is one ``IssueUpdate`` (or ``CommentCreate``, ``IssueRelation…``)
whose answer goes into the shared cache, so the next read needs no request.
Labels change incrementally (``addedLabelIds``/``removedLabelIds``): the
whole set is never replaced, so a label a person adds meanwhile survives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import structlog

from ralph_dev.adapters.tracker.linear.errors import LinearNotFound
from ralph_dev.adapters.tracker.linear.parse import (
    RALPH_MARKER,
    comment_from_node,
    entry_from_node,
    parsing,
)
from ralph_dev.adapters.tracker.linear.reading import LinearReader
from ralph_dev.core.cycles import WAITS_FOR, dependency_cycle, format_cycle, waits
from ralph_dev.core.errors import TrackerInputError, UnknownIssue
from ralph_dev.core.model import Issue, StateType, check_identifier

log = structlog.get_logger(__name__)


class LinearWriter:
    """The writes to one Linear project's existing issues, through the shared context."""

    def __init__(self, reader: LinearReader) -> None:
        self.reader = reader
        self.context = reader.context
        self.client = reader.client
        self.directory = reader.directory

    async def _update(self, issue: Issue, patch: dict[str, Any]) -> Issue:
        cache = await self.context.open_cache()
        try:
            data = await self.client.execute("IssueUpdate", {"id": issue.id, "input": patch})
        except LinearNotFound as exc:
            raise UnknownIssue(f"{issue.identifier}: {exc}") from None
        with parsing("IssueUpdate"):
            entry = entry_from_node(data["issueUpdate"]["issue"])
        cache.store(entry)
        await self.reader.complete(cache, [entry])
        self.context.dirty = True
        return next((i for i in cache.issues() if i.id == entry.id), issue)

    async def set_state(
        self, identifier: str, *, name: str | None = None, type: StateType | None = None
    ) -> Issue:
        """One request when the cache is fresh (the update returns the issue as it is
        now); a cached "already there" is read again before nothing is done."""
        if (name is None) == (type is None):
            raise TrackerInputError("set_state needs exactly one of a state name or type")
        cache = await self.context.open_cache()
        held = cache.by_identifier(identifier) if self.context.fresh(cache) else None
        issue = next((i for i in cache.issues() if i.id == held.id), None) if held else None
        if issue is None or issue.identifier != identifier:
            issue = await self.reader.get(identifier)
        team = await self.context.team_of(issue)
        state = team.state(name=name, type=type)
        if state is None:
            raise TrackerInputError(
                f"team {team.key} has no state {name or type!s}; its states: "
                f"{team.describe_states()}"
            )
        if issue.state_name == state.name and held is not None:
            issue = await self.reader.get(identifier)
        if issue.state_name == state.name:
            return issue
        log.info("linear_set_state", issue=identifier, state=state.name)
        return await self._update(issue, {"stateId": state.id})

    async def change_labels(self, identifier: str, *, add: Sequence[str] = (),
                            remove: Sequence[str] = ()) -> Issue:
        """Incremental label change (addedLabelIds/removedLabelIds), one request at most."""
        issue = await self.reader.get(identifier)
        team = await self.context.team_of(issue)
        add_ids = await self.directory.label_ids([x for x in add if x not in issue.labels], team.id)
        cache = await self.context.open_cache()
        entry = cache.entries.get(issue.id)
        gone = {x.casefold() for x in remove}
        remove_ids = [lid for lid in (entry.label_ids if entry else ())
                      if lid in cache.labels and cache.labels[lid].name.casefold() in gone]
        if not add_ids and not remove_ids:
            return issue
        patch: dict[str, Any] = {}
        if add_ids:
            patch["addedLabelIds"] = add_ids
        if remove_ids:
            patch["removedLabelIds"] = remove_ids
        log.info("linear_labels", issue=identifier, added=list(add), removed=list(remove))
        return await self._update(issue, patch)

    async def set_priority(self, identifier: str, priority: int) -> Issue:
        """One request, none when the issue has that priority already."""
        if priority not in range(5):
            raise TrackerInputError(f"priority {priority!r} is not 0-4")
        issue = await self.reader.get(identifier)
        if issue.priority == priority:
            return issue
        log.info("linear_priority", issue=identifier, priority=priority)
        return await self._update(issue, {"priority": priority})

    async def comment(self, identifier: str, body: str, *, by_ralph: bool = True,
                      author: str | None = None) -> None:
        """``author`` is accepted for the CLI's sake and ignored: Linear signs every comment
        with the key's user. ralph-dev's own comments carry ``RALPH_MARKER`` instead."""
        check_identifier(identifier)
        if not isinstance(body, str) or not body.strip():
            raise TrackerInputError("a comment needs some text")
        if by_ralph and not body.startswith(RALPH_MARKER):
            body = RALPH_MARKER + body
        cache = await self.context.open_cache()
        entry = cache.by_identifier(identifier)
        try:
            data = await self.client.execute("CommentCreate", {
                "input": {"issueId": entry.id if entry else identifier, "body": body}})
        except LinearNotFound:
            raise UnknownIssue(f"no issue {identifier} in Linear") from None
        with parsing("CommentCreate"):
            payload = data["commentCreate"]
            if not payload["success"]:
                raise ValueError("commentCreate did not succeed")
            cid, comment = comment_from_node(payload["comment"])
            cache.add_comment(str(payload["comment"]["issue"]["id"]), cid, comment)
        self.context.dirty = True
        log.info("linear_comment", issue=identifier, by_ralph=by_ralph)

    async def add_blocker(self, identifier: str, blocker: str) -> Issue:
        """Record that ``blocker`` blocks ``identifier``; refuses a cycle, naming it."""
        cache = await self.reader.ensure_full_view()
        issue = await self.reader.get(identifier)
        other = await self.reader.get(blocker)
        if blocker in issue.blocked_by:
            return issue
        edges, parents = waits(cache.issues())
        edges.setdefault(identifier, set()).add(blocker)
        cycle = dependency_cycle(edges, parents)
        if cycle:
            raise TrackerInputError(
                f"{identifier} cannot be blocked by {blocker}: that makes a dependency cycle "
                f"{format_cycle(cycle)} ({WAITS_FOR})"
            )
        await self.client.execute("IssueRelationCreate", {"input": {
            "issueId": other.id, "relatedIssueId": issue.id, "type": "blocks"}})
        log.info("linear_blocker", issue=identifier, blocker=blocker)
        return await self.reader.get(identifier)

    async def remove_blocker(self, identifier: str, blocker: str) -> Issue:
        """Drop every "blocks" relation from ``blocker`` to ``identifier`` (none: no-op)."""
        issue = await self.reader.get(identifier)
        after: str | None = None
        doomed: list[str] = []
        while True:
            data = await self.client.execute("IssueBlockerRelations",
                                             {"id": issue.id, "after": after})
            with parsing("IssueBlockerRelations"):
                relations = data["issue"]["inverseRelations"]
                doomed += [rel["id"] for rel in relations["nodes"]
                           if rel["type"] == "blocks" and rel["issue"]["identifier"] == blocker]
                if not relations["pageInfo"]["hasNextPage"]:
                    break
                after = relations["pageInfo"]["endCursor"]
        for relation in doomed:
            await self.client.execute("IssueRelationDelete", {"id": relation})
        log.info("linear_unblocked", issue=identifier, blocker=blocker, relations=len(doomed))
        return await self.reader.get(identifier)
