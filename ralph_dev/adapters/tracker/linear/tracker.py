"""The Linear tracker: the tracker Protocol over Linear's GraphQL API (gql + aiohttp).

This is the only module that talks to Linear. Every document it sends lives in
``tracker/graphql/*.graphql`` (named operations only) and a test validates each
one against Linear's published schema, so a typo fails in CI, not at 3 a.m.

Budget: Linear allows about 2,500 requests and 3,000,000 complexity points per
hour per user. A full sync (every issue of the project, paginated so one query
stays far under the 10,000-point cap) runs at start and every
``full_sync_interval``; in between, ``list_issues`` costs ONE request (issues
updated since the last poll minus an overlap, archived ones included, and new
comments) merged into an in-memory cache. Relations have no change signal,
which is why the full sync exists at all.

Failures: rate limiting (HTTP 400 + ``RATELIMITED``), 5xx, timeouts, refused
connections and garbage answers are ``TrackerUnavailable`` (retryable): the
client backs off with jitter and refuses calls until the backoff ends, so a
controller ticking every few seconds does not hammer a struggling API. A
rejected key is not retryable and names where the key came from, never the
key itself.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import structlog

from ralph_dev.adapters.tracker.linear.client import (
    DEFAULT_URL,
    URL_ENV,
    LinearClient,
    LinearNotFound,
    LinearPartialCreate,
    LinearSetupError,
    load_api_key,
)
from ralph_dev.adapters.tracker.linear.parse import (
    RALPH_MARKER,
    Entry,
    LinearLabel,
    LinearProject,
    LinearState,
    LinearTeam,
    comment_from_node,
    entry_from_node,
    parsing,
)
from ralph_dev.core.config import Labels
from ralph_dev.core.cycles import find_cycle, format_cycle
from ralph_dev.core.errors import (
    ConfigError,
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
    from ralph_dev.core.config import ProjectSettings

log = structlog.get_logger(__name__)

PAGE_SIZE = 25
"""Issues per page: ~115 points each (see fragments.graphql), ~2,900 per query."""
PROJECTS_PAGE = 100
LABELS_PAGE = 250
POLL_OVERLAP = timedelta(minutes=2)


# --- the tracker -----------------------------------------------------------------------


class LinearTracker:
    """The issues of one Linear project, behind ``tracker.base.Tracker``."""

    def __init__(
        self,
        client: LinearClient,
        project: str,
        *,
        full_sync_interval: float = 300.0,
        page_size: int = PAGE_SIZE,
        labels: Labels | None = None,
    ) -> None:
        if not project or not str(project).strip():
            raise ConfigError("tracker.linear_project is empty: set a project id, slug or name")
        self.client = client
        self.project_ref = str(project).strip()
        self.full_sync_interval = full_sync_interval
        self.page_size = page_size
        self.label_settings = labels or Labels()
        self._project: LinearProject | None = None
        self._labels: list[LinearLabel] | None = None
        self._cache: dict[str, Entry] | None = None
        self._last_full: datetime | None = None
        self.full_syncs = 0
        self.polls = 0

    @classmethod
    def from_settings(cls, settings: ProjectSettings, **client_args: Any) -> LinearTracker:
        key = load_api_key(settings.tracker)
        url = os.environ.get(URL_ENV) or DEFAULT_URL
        client = LinearClient(key, url, **client_args)
        return cls(client, settings.tracker.linear_project or "",
                   full_sync_interval=settings.tracker.full_sync_interval,
                   labels=settings.labels)

    def __repr__(self) -> str:
        return f"LinearTracker({self.project_ref!r}, {self.client!r})"

    @property
    def clock(self) -> Callable[[], datetime]:
        return self.client.clock

    def usage(self) -> dict[str, Any]:
        """For ``status``: requests/complexity per hour, rate limit, sync counts."""
        out = self.client.usage()
        out.update(full_syncs=self.full_syncs, polls=self.polls,
                   last_full_sync=self._last_full.isoformat() if self._last_full else None,
                   cached_issues=len(self._cache or {}))
        return out

    # --- project, teams, labels ------------------------------------------------------

    async def viewer(self) -> dict[str, str]:
        """Who the key belongs to (the auth check of ``init``)."""
        data = await self.client.execute("Viewer")
        with parsing("Viewer"):
            return {"id": str(data["viewer"]["id"]), "name": str(data["viewer"]["name"])}

    async def project(self) -> LinearProject:
        """The configured project, found by id, slug (or URL slug) or name."""
        if self._project is not None:
            return self._project
        ref = self.project_ref
        candidates: list[tuple[str, str, str]] = []
        after: str | None = None
        while True:
            data = await self.client.execute("Projects", {"first": PROJECTS_PAGE,
                                                          "after": after})
            with parsing("Projects"):
                conn = data["projects"]
                candidates += [(str(n["id"]), str(n["name"]), str(n["slugId"]))
                               for n in conn["nodes"]]
                if not conn["pageInfo"]["hasNextPage"]:
                    break
                after = conn["pageInfo"]["endCursor"]
        tail = ref.rsplit("-", 1)[-1]
        found = [c for c in candidates if ref in (c[0], c[2]) or tail == c[2]]
        if not found:
            found = [c for c in candidates if c[1].casefold() == ref.casefold()]
        if len(found) > 1:
            listing = ", ".join(f"{n!r} (slug {s})" for _i, n, s in found)
            raise LinearSetupError(
                f"Linear project name {ref!r} is ambiguous: {listing}; set "
                "tracker.linear_project to the slug instead"
            )
        if not found:
            names = [c[1] for c in candidates]
            close = difflib.get_close_matches(ref, names, n=5, cutoff=0.3)
            hint = ("closest: " + ", ".join(repr(n) for n in close)) if close else (
                "projects visible to this key: " + (", ".join(repr(n) for n in names[:10])
                                                    or "none"))
            raise LinearSetupError(
                f"no Linear project matches {ref!r} ({hint}); set tracker.linear_project "
                "(or --linear-project) to a project id, slug or name"
            )
        pid = found[0][0]
        data = await self.client.execute("ProjectTeams", {"id": pid})
        with parsing("ProjectTeams"):
            node = data["project"]
            teams = tuple(
                LinearTeam(
                    id=str(t["id"]), key=str(t["key"]), name=str(t["name"]),
                    states=tuple(
                        LinearState(str(s["id"]), str(s["name"]), str(s["type"]),
                                    float(s["position"]))
                        for s in t["states"]["nodes"]
                    ),
                )
                for t in node["teams"]["nodes"]
            )
            self._project = LinearProject(str(node["id"]), str(node["name"]),
                                          found[0][2], teams)
        log.info("linear_project", project=self._project.name, teams=[t.key for t in teams])
        return self._project

    def check_states(self, project: LinearProject) -> None:
        """Every team needs a started and a completed state (ralph-dev moves issues there)."""
        if not project.teams:
            raise LinearSetupError(
                f"Linear project {project.name!r} has no teams; add a team to it in Linear"
            )
        for team in project.teams:
            types = {s.type for s in team.states}
            missing = [t for t in ("started", "completed") if t not in types]
            if missing:
                raise LinearSetupError(
                    f"Linear team {team.name} ({team.key}) has no workflow state of type "
                    f"{' or '.join(missing)}; add one in Linear → Settings → Teams → "
                    f"{team.name} → Workflow"
                )

    async def labels(self, *, reload: bool = False) -> list[LinearLabel]:
        if self._labels is not None and not reload:
            return self._labels
        out: list[LinearLabel] = []
        after: str | None = None
        while True:
            data = await self.client.execute("Labels", {"first": LABELS_PAGE, "after": after})
            with parsing("Labels"):
                conn = data["issueLabels"]
                out += [
                    LinearLabel(str(n["id"]), str(n["name"]),
                                (n.get("team") or {}).get("id"), bool(n["isGroup"]))
                    for n in conn["nodes"]
                ]
                if not conn["pageInfo"]["hasNextPage"]:
                    break
                after = conn["pageInfo"]["endCursor"]
        self._labels = out
        return out

    def _pick_label(self, labels: Sequence[LinearLabel], name: str,
                    team_id: str) -> LinearLabel | None:
        """The team's label called ``name``, else the workspace's; two of either → error."""
        same = [lab for lab in labels
                if lab.name.casefold() == name.casefold() and not lab.is_group]
        for scope, group in (("team", [x for x in same if x.team_id == team_id]),
                             ("workspace", [x for x in same if x.team_id is None])):
            if len(group) > 1:
                raise LinearSetupError(
                    f"Linear label {name!r} exists {len(group)} times as a {scope} label; "
                    "rename or merge the duplicates in Linear → Settings → Labels"
                )
            if group:
                return group[0]
        return None

    async def _label_ids(self, names: Sequence[str], team_id: str) -> list[str]:
        """Ids for ``names`` on ``team_id``'s issues, creating missing ones as team labels."""
        ids = []
        labels = await self.labels()
        for name in names:
            if not isinstance(name, str) or not name.strip() or len(name) > 80:
                raise TrackerInputError(f"label {name!r} is not usable (1-80 characters)")
            label = self._pick_label(labels, name, team_id)
            if label is None:
                labels = await self.labels(reload=True)
                label = self._pick_label(labels, name, team_id)
            if label is None:
                label = await self._create_label(name, team_id)
            ids.append(label.id)
        return ids

    async def _create_label(self, name: str, team_id: str | None) -> LinearLabel:
        data = await self.client.execute(
            "IssueLabelCreate", {"input": {"name": name, "teamId": team_id}})
        with parsing("IssueLabelCreate"):
            node = data["issueLabelCreate"]["issueLabel"]
            label = LinearLabel(str(node["id"]), str(node["name"]),
                                (node.get("team") or {}).get("id"))
        if self._labels is not None:
            self._labels.append(label)
        log.info("linear_label_created", label=name, team_label=team_id is not None)
        return label

    async def ensure_labels(self, names: Sequence[str]) -> list[str]:
        """Create the steering labels that are missing (as workspace labels); return those
        created. A name every team of the project already has counts as present."""
        project = await self.project()
        labels = await self.labels(reload=True)
        created = []
        for name in names:
            present = any(lab.team_id is None and lab.name.casefold() == name.casefold()
                          for lab in labels)
            if not present and project.teams:
                present = all(self._pick_label(labels, name, t.id) is not None
                              for t in project.teams)
            if not present:
                await self._create_label(name, None)
                created.append(name)
        return created

    # --- reading --------------------------------------------------------------------

    def _issues(self) -> list[Issue]:
        cache = self._cache or {}
        children: dict[str, list[str]] = {}
        for entry in cache.values():
            if entry.issue.parent:
                children.setdefault(entry.issue.parent, []).append(entry.issue.identifier)
        out = []
        for entry in cache.values():
            out.append(self._materialize(entry, children))
        out.sort(key=lambda i: (i.identifier.rsplit("-", 1)[0], int(i.identifier.rsplit("-")[1])))
        return out

    @staticmethod
    def _materialize(entry: Entry, children: Mapping[str, list[str]]) -> Issue:
        kids = sorted(children.get(entry.issue.identifier, ()),
                      key=lambda x: int(x.rsplit("-", 1)[1]))
        comments = tuple(sorted(entry.comments.values(), key=lambda c: c.created_at))
        return replace(entry.issue, children=tuple(kids), comments=comments)

    def _store(self, entry: Entry, project_id: str) -> None:
        """Put a fresh issue into the cache (or drop it: archived, moved, odd identifier)."""
        assert self._cache is not None
        old = self._cache.get(entry.issue.id)
        if old is not None:
            fresh, entry.comments = entry.comments, dict(old.comments)
            entry.add_comments(fresh)
        if entry.gone or entry.project_id != project_id:
            self._cache.pop(entry.issue.id, None)
            return
        if not IDENTIFIER_RE.fullmatch(entry.issue.identifier):
            log.warning("linear_odd_identifier", identifier=entry.issue.identifier[:40])
            return
        self._cache[entry.issue.id] = entry

    async def _full_sync(self, project: LinearProject) -> None:
        started = self.clock()
        fresh: dict[str, Entry] = {}
        after: str | None = None
        while True:
            data = await self.client.execute(
                "ProjectIssues",
                {"projectId": project.id, "first": self.page_size, "after": after})
            with parsing("ProjectIssues"):
                conn = data["issues"]
                entries = [entry_from_node(n) for n in conn["nodes"]]
                more = bool(conn["pageInfo"]["hasNextPage"])
                after = conn["pageInfo"]["endCursor"]
            for entry in entries:
                fresh[entry.issue.id] = entry
            if not more:
                break
        old = self._cache or {}
        self._cache = {}
        for entry in fresh.values():
            if entry.issue.id in old:
                fresh_comments, entry.comments = entry.comments, dict(old[entry.issue.id].comments)
                entry.add_comments(fresh_comments)
            self._store(entry, project.id)
        self._last_full = started
        self.full_syncs += 1
        log.info("linear_full_sync", issues=len(self._cache))

    def _since(self) -> datetime:
        """Poll window start: the newest change seen (Linear's own clock) minus an overlap."""
        seen = [e.issue.updated_at for e in (self._cache or {}).values() if e.issue.updated_at]
        seen += [c.created_at for e in (self._cache or {}).values() for c in e.comments.values()]
        newest = max(seen) if seen else (self._last_full or self.clock())
        return newest - POLL_OVERLAP

    async def _poll(self, project: LinearProject) -> None:
        since = self._since().isoformat().replace("+00:00", "Z")
        issues_after: str | None = None
        comments_after: str | None = None
        while True:
            data = await self.client.execute("ProjectChanges", {
                "projectId": project.id, "since": since, "first": self.page_size,
                "issuesAfter": issues_after, "commentsAfter": comments_after})
            with parsing("ProjectChanges"):
                iconn, cconn = data["issues"], data["comments"]
                entries = [entry_from_node(n) for n in iconn["nodes"]]
                comments = [((n.get("issue") or {}).get("id"), *comment_from_node(n))
                            for n in cconn["nodes"]]
                more_i = bool(iconn["pageInfo"]["hasNextPage"])
                more_c = bool(cconn["pageInfo"]["hasNextPage"])
                issues_after = iconn["pageInfo"]["endCursor"] or issues_after
                comments_after = cconn["pageInfo"]["endCursor"] or comments_after
            for entry in entries:
                self._store(entry, project.id)
            assert self._cache is not None
            for issue_id, cid, comment in comments:
                target = self._cache.get(str(issue_id))
                if target is not None:
                    target.add_comments({cid: comment})
            if not (more_i or more_c):
                break
        self.polls += 1

    async def list_issues(self) -> list[Issue]:
        project = await self.project()
        now = self.clock()
        due = (self._last_full is None
               or (now - self._last_full).total_seconds() >= self.full_sync_interval)
        if self._cache is None or due:
            await self._full_sync(project)
        else:
            await self._poll(project)
        return self._issues()

    async def _ensure_cache(self) -> None:
        if self._cache is None:
            await self.list_issues()

    def _find(self, identifier: str) -> Entry | None:
        for entry in (self._cache or {}).values():
            if entry.issue.identifier == identifier:
                return entry
        return None

    async def refresh(self, identifiers: Sequence[str]) -> list[Issue]:
        wanted = [check_identifier(i) for i in identifiers]
        if not wanted:
            return []
        project = await self.project()
        await self._ensure_cache()
        known = {e.issue.id: e.issue.identifier for i in wanted if (e := self._find(i))}
        seen: set[str] = set()
        ids = sorted(known)
        entries: list[Entry] = []
        for start in range(0, len(ids), self.page_size):  # a page per query: complexity cap
            chunk = ids[start:start + self.page_size]
            data = await self.client.execute("IssuesByIds", {"ids": chunk, "first": len(chunk)})
            with parsing("IssuesByIds"):
                entries += [entry_from_node(n) for n in data["issues"]["nodes"]]
        if known:
            for entry in entries:
                seen.add(entry.issue.id)
                self._store(entry, project.id)
            assert self._cache is not None
            for gone in set(known) - seen:  # deleted in Linear
                self._cache.pop(gone, None)
        for identifier in wanted:
            if identifier in known.values():
                continue
            try:
                data = await self.client.execute("Issue", {"id": identifier})
            except LinearNotFound:
                continue
            with parsing("Issue"):
                entry = entry_from_node(data["issue"])
            self._store(entry, project.id)
        result = self._issues()
        by_ident = {i.identifier: i for i in result}
        return [by_ident[i] for i in dict.fromkeys(wanted) if i in by_ident]

    async def get(self, identifier: str) -> Issue:
        found = await self.refresh([identifier])
        if not found:
            name = self._project.name if self._project else self.project_ref
            raise UnknownIssue(f"no issue {identifier} in Linear project {name!r}")
        return found[0]

    # --- writing --------------------------------------------------------------------

    async def _team_of(self, issue: Issue) -> LinearTeam:
        project = await self.project()
        entry = self._find(issue.identifier)
        for team in project.teams:
            if (entry and team.id == entry.team_id) or team.key == issue.team:
                return team
        raise LinearSetupError(
            f"{issue.identifier} belongs to team {issue.team}, which is not a team of Linear "
            f"project {project.name!r}; add the team to the project in Linear"
        )

    async def _update(self, issue: Issue, patch: dict[str, Any]) -> Issue:
        project = await self.project()
        try:
            data = await self.client.execute("IssueUpdate", {"id": issue.id, "input": patch})
        except LinearNotFound as exc:
            raise UnknownIssue(f"{issue.identifier}: {exc}") from None
        with parsing("IssueUpdate"):
            entry = entry_from_node(data["issueUpdate"]["issue"])
        self._store(entry, project.id)
        return self._materialize(entry, self._children())

    def _children(self) -> dict[str, list[str]]:
        children: dict[str, list[str]] = {}
        for entry in (self._cache or {}).values():
            if entry.issue.parent:
                children.setdefault(entry.issue.parent, []).append(entry.issue.identifier)
        return children

    async def set_state(
        self, identifier: str, *, name: str | None = None, type: StateType | None = None
    ) -> Issue:
        if (name is None) == (type is None):
            raise TrackerInputError("set_state needs exactly one of a state name or type")
        issue = await self.get(identifier)
        team = await self._team_of(issue)
        state = team.state(name=name, type=type)
        if state is None:
            have = ", ".join(f"{s.name} ({s.type})" for s in team.states)
            raise TrackerInputError(
                f"team {team.key} has no state {name or type!s}; its states: {have}"
            )
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
        entry = self._find(identifier)
        on_issue = entry.label_ids if entry else {}
        gone = {x.casefold() for x in remove}
        remove_ids = [lid for lid, lname in on_issue.items() if lname.casefold() in gone]
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
        entry = self._find(identifier)
        try:
            data = await self.client.execute("CommentCreate", {
                "input": {"issueId": entry.issue.id if entry else identifier, "body": body}})
        except LinearNotFound:
            raise UnknownIssue(f"no issue {identifier} in Linear") from None
        with parsing("CommentCreate"):
            if not data["commentCreate"]["success"]:
                raise ValueError("commentCreate did not succeed")
        log.info("linear_comment", issue=identifier, by_ralph=by_ralph)

    async def add_blocker(self, identifier: str, blocker: str) -> Issue:
        """Record that ``blocker`` blocks ``identifier``; refuses a cycle, naming it."""
        issue = await self.get(identifier)
        other = await self.get(blocker)
        if blocker in issue.blocked_by:
            return issue
        edges: dict[str, set[str]] = {}
        for entry in (self._cache or {}).values():
            edges[entry.issue.identifier] = set(entry.issue.blocked_by)
        edges.setdefault(identifier, set()).add(blocker)
        cycle = find_cycle(edges)
        if cycle:
            raise TrackerInputError(
                f"{identifier} cannot be blocked by {blocker}: that makes a blocker cycle "
                f"{format_cycle(cycle)} (each is blocked by the next)"
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

    async def create_issues(self, new: Sequence[NewIssue]) -> list[str]:
        """Create in parent-first order, then the "blocks" relations. Linear has no
        transactions: on failure ``LinearPartialCreate`` lists what was created."""
        entries = list(new)
        if not entries:
            return []
        refs = self._check_batch(entries)
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
        project = await self.project()
        await self._ensure_cache()
        default_team = project.teams[0] if project.teams else None
        made: dict[int, tuple[str, str, LinearTeam]] = {}  # index → (uuid, identifier, team)
        done: list[str] = []

        def failed(i: int, exc: Exception) -> LinearPartialCreate:
            created = ", ".join(done) or "none"
            return LinearPartialCreate(
                f"creating entry {i + 1} ({entries[i].title!r}) failed: {exc}; already created "
                f"in Linear: {created} (fix the problem, then create only the rest)", done)

        for i in order:
            entry = entries[i]
            try:
                team = default_team
                parent_id = None
                if entry.parent:
                    if entry.parent in refs:
                        parent_id, _ident, team = made[refs[entry.parent]]
                    else:
                        parent = await self.get(entry.parent)
                        parent_id = parent.id
                        team = await self._team_of(parent)
                if team is None:
                    raise LinearSetupError(f"Linear project {project.name!r} has no teams")
                payload: dict[str, Any] = {
                    "teamId": team.id, "title": entry.title.strip(),
                    "description": entry.description, "priority": entry.priority,
                    "projectId": project.id,
                }
                if parent_id:
                    payload["parentId"] = parent_id
                if entry.labels:
                    payload["labelIds"] = await self._label_ids(entry.labels, team.id)
                if entry.state:
                    state = team.state(name=entry.state, type=None)
                    if state is None:
                        raise TrackerInputError(f"team {team.key} has no state {entry.state!r}")
                    payload["stateId"] = state.id
                data = await self.client.execute("IssueCreate", {"input": payload})
                with parsing("IssueCreate"):
                    node = data["issueCreate"]["issue"]
                    made[i] = (str(node["id"]), str(node["identifier"]), team)
                done.append(made[i][1])
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
        created = [made[i][1] for i in range(len(entries))]
        log.info("linear_issues_created", count=len(created), first=created[0])
        return created

    async def close(self) -> None:
        """Nothing to release: every call opens and closes its own HTTP session."""
