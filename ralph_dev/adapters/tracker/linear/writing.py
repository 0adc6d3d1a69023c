"""Writing Linear: states, labels, priorities, comments and blockers of existing issues.

Each write is one ``IssueUpdate`` (or ``CommentCreate``, ``IssueRelation…``)
whose answer goes into the shared cache, so the next read needs no request.
Labels change incrementally (``addedLabelIds``/``removedLabelIds``): the
whole set is never replaced, so a label a person adds meanwhile survives.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
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

    async def _write(self, identifier: str,
                     patch_for: Callable[[Issue], Awaitable[dict[str, Any] | None]]) -> Issue:
        """Send ``patch_for(issue)`` (None: nothing to change), decided on the issue as
        held (no request). Every patch sets a value or adds/removes labels, so a held
        issue a little behind Linear still gets the right end state; only a held "nothing
        to change" is checked on the issue read now, so a person's change made meanwhile
        is never taken for ours. One request when the issue is held, two otherwise."""
        held = await self.reader.held(identifier)
        if held is not None:
            patch = await patch_for(held)
            if patch is not None:
                return await self._update(held, patch)
        issue = await self.reader.read(identifier)
        patch = await patch_for(issue)
        return issue if patch is None else await self._update(issue, patch)

    async def set_state(
        self, identifier: str, *, name: str | None = None, type: StateType | None = None
    ) -> Issue:
        """Move the issue to the state called ``name``, or its team's first of ``type``."""
        if (name is None) == (type is None):
            raise TrackerInputError("set_state needs exactly one of a state name or type")

        async def patch_for(issue: Issue) -> dict[str, Any] | None:
            team = await self.context.team_of(issue)
            state = team.state(name=name, type=type)
            if state is None:
                raise TrackerInputError(
                    f"team {team.key} has no state {name or type!s}; its states: "
                    f"{team.describe_states()}"
                )
            if issue.state_name == state.name:
                return None
            log.info("linear_set_state", issue=identifier, state=state.name)
            return {"stateId": state.id}

        return await self._write(identifier, patch_for)

    async def change_labels(self, identifier: str, *, add: Sequence[str] = (),
                            remove: Sequence[str] = ()) -> Issue:
        """Incremental label change (addedLabelIds/removedLabelIds), one request at most
        when the issue is held."""

        async def patch_for(issue: Issue) -> dict[str, Any] | None:
            team = await self.context.team_of(issue)
            add_ids = await self.directory.label_ids(
                [x for x in add if x not in issue.labels], team.id)
            cache = await self.context.open_cache()
            entry = cache.entries.get(issue.id)
            gone = {x.casefold() for x in remove}
            remove_ids = [lid for lid in (entry.label_ids if entry else ())
                          if lid in cache.labels and cache.labels[lid].name.casefold() in gone]
            patch: dict[str, Any] = {}
            if add_ids:
                patch["addedLabelIds"] = add_ids
            if remove_ids:
                patch["removedLabelIds"] = remove_ids
            if patch:
                log.info("linear_labels", issue=identifier, added=list(add),
                         removed=list(remove))
            return patch or None

        return await self._write(identifier, patch_for)

    async def set_priority(self, identifier: str, priority: int) -> Issue:
        """None when the issue has that priority already."""
        if priority not in range(5):
            raise TrackerInputError(f"priority {priority!r} is not 0-4")

        async def patch_for(issue: Issue) -> dict[str, Any] | None:
            if issue.priority == priority:
                return None
            log.info("linear_priority", issue=identifier, priority=priority)
            return {"priority": priority}

        return await self._write(identifier, patch_for)

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
        issue = await self.reader.read(identifier)  # both read now: the cycle check
        other = await self.reader.read(blocker)  # sees their relations as they are
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
        return await self.reader.read(identifier)

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
        return await self.reader.read(identifier)
