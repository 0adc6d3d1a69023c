"""The Linear tracker: the tracker Protocol over Linear's GraphQL API (gql + aiohttp).

This is the only module that decides what to ask Linear. Every document it
sends lives in ``graphql/*.graphql`` (named operations only) and a test
validates each one against Linear's published schema, so a typo fails in CI,
not at 3 a.m.

Reading. A full sync (every issue of the project, in pages that stay under
5,000 complexity points, then the rest of any connection a page cut short, then
the state of blockers and sub-issues outside the project) runs at start and
every ``full_sync_interval``; it is saved to a disk cache that short-lived
processes start from. In between, ``list_issues`` polls at most every
``poll_interval`` seconds (controller ticks in between read the cache; a write
by another ralph-dev process of the project forces the next poll), and a poll
is ONE request that downloads no issue text: which issues changed (id and
updatedAt, over an overlapping window), which comments are new, and the newest
relation changes of the workspace. Only what is actually new is then fetched
(one more request). See ``benchmarks/linear_budget.py`` for what this costs.

Writing. New issues go to the team's first "unstarted" state (Todo), or
``tracker.linear_new_state``, in the parent's team, else ``tracker.linear_team``,
else the project's only team. Labels change incrementally.

Failures are the client's business (``client.py``): typed errors, backoff
shared by every process of the project, never a secret in a message.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from ralph_dev.adapters.tracker.linear.errors import (
    LinearNotFound,
    LinearPartialCreate,
    LinearSetupError,
)
from ralph_dev.adapters.tracker.linear.parse import (
    RALPH_MARKER,
    LinearProject,
    LinearState,
    LinearTeam,
    comment_from_node,
    entry_from_node,
    parsing,
)
from ralph_dev.core.cycles import WAITS_FOR, batch_cycle, dependency_cycle, format_cycle
from ralph_dev.core.errors import (
    TrackerError,
    TrackerInputError,
    UnknownIssue,
)
from ralph_dev.core.model import (
    IDENTIFIER_RE,
    Issue,
    NewIssue,
    StateType,
    check_identifier,
)

if TYPE_CHECKING:
    pass

from ralph_dev.adapters.tracker.linear.reading import LinearReader

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class CreatePlan:
    """Where one new issue goes, decided for the whole batch before anything is created."""

    team: LinearTeam
    state: LinearState
    parent_id: str | None


def _waits(issues: Iterable[Issue]) -> tuple[dict[str, set[str]], dict[str, str]]:
    """What waits for what among ``issues``: blockers by issue, and each sub-issue's parent."""
    issues = list(issues)
    blocked_by = {issue.identifier: set(issue.blocked_by) for issue in issues}
    parent_of = {child: issue.identifier for issue in issues for child in issue.children}
    return blocked_by, parent_of


class LinearTracker(LinearReader):
    """The issues of one Linear project, behind ``core.ports.Tracker``."""

    # --- writing --------------------------------------------------------------------

    async def _team_of(self, issue: Issue) -> LinearTeam:
        project = await self.project()
        cache = await self._open_cache()
        entry = cache.entries.get(issue.id)
        team = project.team(entry.team_id if entry else issue.team or "")
        if team is None:
            raise LinearSetupError(
                f"{issue.identifier} belongs to team {issue.team}, which is not a team of "
                f"Linear project {project.name!r}; add the team to the project in Linear"
            )
        return team

    async def _update(self, issue: Issue, patch: dict[str, Any]) -> Issue:
        cache = await self._open_cache()
        try:
            data = await self.client.execute("IssueUpdate", {"id": issue.id, "input": patch})
        except LinearNotFound as exc:
            raise UnknownIssue(f"{issue.identifier}: {exc}") from None
        with parsing("IssueUpdate"):
            entry = entry_from_node(data["issueUpdate"]["issue"])
        cache.store(entry)
        await self._complete(cache, [entry])
        self._dirty = True
        return next((i for i in cache.issues() if i.id == entry.id), issue)

    async def set_state(
        self, identifier: str, *, name: str | None = None, type: StateType | None = None
    ) -> Issue:
        """One request when the cache is fresh (the update returns the issue as it is
        now); a cached "already there" is read again before nothing is done."""
        if (name is None) == (type is None):
            raise TrackerInputError("set_state needs exactly one of a state name or type")
        cache = await self._open_cache()
        held = cache.by_identifier(identifier) if self._fresh(cache) else None
        issue = next((i for i in cache.issues() if i.id == held.id), None) if held else None
        if issue is None or issue.identifier != identifier:
            issue = await self.get(identifier)
        team = await self._team_of(issue)
        state = team.state(name=name, type=type)
        if state is None:
            raise TrackerInputError(
                f"team {team.key} has no state {name or type!s}; its states: "
                f"{team.describe_states()}"
            )
        if issue.state_name == state.name and held is not None:
            issue = await self.get(identifier)
        if issue.state_name == state.name:
            return issue
        log.info("linear_set_state", issue=identifier, state=state.name)
        return await self._update(issue, {"stateId": state.id})

    async def change_labels(self, identifier: str, *, add: Sequence[str] = (),
                            remove: Sequence[str] = ()) -> Issue:
        """Incremental label change (addedLabelIds/removedLabelIds), one request at most."""
        issue = await self.get(identifier)
        team = await self._team_of(issue)
        add_ids = await self._label_ids([x for x in add if x not in issue.labels], team.id)
        cache = await self._open_cache()
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

    async def add_labels(self, identifier: str, labels: Sequence[str]) -> Issue:
        return await self.change_labels(identifier, add=labels)

    async def set_priority(self, identifier: str, priority: int) -> Issue:
        """One request, none when the issue has that priority already."""
        if priority not in range(5):
            raise TrackerInputError(f"priority {priority!r} is not 0-4")
        issue = await self.get(identifier)
        if issue.priority == priority:
            return issue
        log.info("linear_priority", issue=identifier, priority=priority)
        return await self._update(issue, {"priority": priority})

    async def remove_labels(self, identifier: str, labels: Sequence[str]) -> Issue:
        return await self.change_labels(identifier, remove=labels)

    async def comment(self, identifier: str, body: str, *, by_ralph: bool = True,
                      author: str | None = None) -> None:
        """``author`` is accepted for the CLI's sake and ignored: Linear signs every comment
        with the key's user. ralph-dev's own comments carry ``RALPH_MARKER`` instead."""
        check_identifier(identifier)
        if not isinstance(body, str) or not body.strip():
            raise TrackerInputError("a comment needs some text")
        if by_ralph and not body.startswith(RALPH_MARKER):
            body = RALPH_MARKER + body
        cache = await self._open_cache()
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
        self._dirty = True
        log.info("linear_comment", issue=identifier, by_ralph=by_ralph)

    async def add_blocker(self, identifier: str, blocker: str) -> Issue:
        """Record that ``blocker`` blocks ``identifier``; refuses a cycle, naming it."""
        cache = await self._ensure_full_view()
        issue = await self.get(identifier)
        other = await self.get(blocker)
        if blocker in issue.blocked_by:
            return issue
        edges, parents = _waits(cache.issues())
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
        return await self.get(identifier)

    async def remove_blocker(self, identifier: str, blocker: str) -> Issue:
        """Drop every "blocks" relation from ``blocker`` to ``identifier`` (none: no-op)."""
        issue = await self.get(identifier)
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
        return await self.get(identifier)

    def _check_batch(self, entries: Sequence[NewIssue]) -> dict[str, int]:
        refs: dict[str, int] = {}
        for i, entry in enumerate(entries):
            name = f"entry {i + 1} ({entry.ref or entry.title!r})"
            if not isinstance(entry.title, str) or not entry.title.strip():
                raise TrackerInputError(f"{name}: the title is empty")
            if not isinstance(entry.priority, int) or not 0 <= entry.priority <= 4:
                raise TrackerInputError(f"{name}: priority {entry.priority!r} is not 0-4")
            if entry.ref is not None:
                if entry.ref in refs or IDENTIFIER_RE.fullmatch(entry.ref):
                    raise TrackerInputError(f"{name}: ref {entry.ref!r} is reused or looks "
                                            "like an identifier")
                refs[entry.ref] = i
        for i, entry in enumerate(entries):
            for text in [*entry.blocked_by, *([entry.parent] if entry.parent else [])]:
                if text not in refs:
                    try:
                        check_identifier(text)
                    except ValueError:
                        raise TrackerInputError(
                            f"entry {i + 1}: {text!r} is neither an identifier nor a ref "
                            "of this batch") from None
        return refs

    @staticmethod
    def _parents_first(entries: Sequence[NewIssue], refs: dict[str, int]) -> list[int]:
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

    def _default_team(self, project: LinearProject) -> LinearTeam:
        """Where an issue without a parent goes: ``tracker.linear_team``, else the
        project's only team; several teams and no setting is an error naming them."""
        if self.default_team:
            team = project.team(self.default_team)
            if team is None:
                raise LinearSetupError(self._team_choices(
                    project, f"tracker.linear_team = {self.default_team!r} is not"))
            return team
        if len(project.teams) == 1:
            return project.teams[0]
        if not project.teams:
            raise LinearSetupError(f"Linear project {project.name!r} has no teams; add one")
        raise LinearSetupError(self._team_choices(
            project, "a new issue without a parent needs a team, and there is more than one in"))

    def _new_state(self, team: LinearTeam, asked: str | None,
                   asked_type: StateType | None = None) -> LinearState:
        """The entry's own state (by name, else the first of its type), else
        ``tracker.linear_new_state``, else the team's first "unstarted" state (Todo) —
        never Linear's default, which is a Backlog state that ralph-dev would never
        dispatch from (a groom proposal asks for one by type)."""
        name = asked or (None if asked_type else self.new_state)
        state = team.state(name=name, type=None if name else asked_type or StateType.UNSTARTED)
        if state is None:
            setting = "" if asked else " (tracker.linear_new_state)"
            wanted = repr(name) + setting if name else "of type unstarted"
            raise TrackerInputError(f"team {team.key} has no state {wanted}; its states: "
                                    f"{team.describe_states()}")
        return state

    async def _plan_creates(self, entries: Sequence[NewIssue], refs: dict[str, int],
                            order: Sequence[int]) -> dict[int, CreatePlan]:
        """Team, state and parent of every entry, checked before anything is created."""
        project = await self.project()
        plans: dict[int, CreatePlan] = {}
        for i in order:
            entry = entries[i]
            parent_id = None
            if entry.parent and entry.parent in refs:
                team = plans[refs[entry.parent]].team
            elif entry.parent:
                parent = await self.get(entry.parent)
                parent_id = parent.id
                team = await self._team_of(parent)
            else:
                team = self._default_team(project)
            state = self._new_state(team, entry.state, entry.state_type)
            plans[i] = CreatePlan(team, state, parent_id)
        return plans

    async def create_issues(self, new: Sequence[NewIssue]) -> list[str]:
        """Create in parent-first order, then the "blocks" relations. Linear has no
        transactions: on failure ``LinearPartialCreate`` lists what was created."""
        entries = list(new)
        if not entries:
            return []
        refs = self._check_batch(entries)
        order = self._parents_first(entries, refs)
        project = await self.project()
        cache = await self._open_cache()
        # What is cached (no request): a batch hangs under issues ralph-dev just read.
        cycle = batch_cycle(entries, *_waits(cache.issues()))
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
                    payload["labelIds"] = await self._label_ids(entry.labels, plan.team.id)
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
                        blocker_id = (await self.get(blocker)).id
                    await self.client.execute("IssueRelationCreate", {"input": {
                        "issueId": blocker_id, "relatedIssueId": made[i][0], "type": "blocks"}})
                except TrackerError as exc:
                    raise failed(i, exc) from None
        created_ids = [made[i][1] for i in range(len(entries))]
        log.info("linear_issues_created", count=len(created_ids), first=created_ids[0],
                 teams=sorted({plans[i].team.key for i in order}),
                 states=sorted({plans[i].state.name for i in order}))
        return created_ids

    async def close(self) -> None:
        """Save what a poll or write added to the disk cache; every call opens and closes
        its own HTTP session, so there is nothing else to release."""
        if self._dirty:
            self._save(force=True)


