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

import difflib
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from ralph_dev.adapters.tracker.base import (
    TrackerError,
    TrackerInputError,
    UnknownIssue,
)
from ralph_dev.adapters.tracker.linear.cache import (
    CACHE_FILE,
    PROJECT_FILE,
    RATE_FILE,
    IssueCache,
    load_cache,
    load_project,
    save_json,
    save_project,
)
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
    blockers_from,
    children_from,
    comment_from_node,
    entry_from_node,
    linear_time,
    next_page,
    parse_time,
    parsing,
)
from ralph_dev.adapters.tracker.local import find_cycle, format_cycle
from ralph_dev.core.config import ConfigError, Labels
from ralph_dev.core.model import (
    IDENTIFIER_RE,
    Comment,
    Issue,
    NewIssue,
    StateType,
    check_identifier,
)

if TYPE_CHECKING:
    from ralph_dev.core.config import ProjectSettings

log = structlog.get_logger(__name__)

PAGE_SIZE = 60
"""Issues per full-sync page: IssueFields is about 71 points, so about 4,300 per query
(under 5,000; Linear refuses anything over 10,000)."""
BY_ID_PAGE = 50
"""Issues per query when fetching known ids in full (polls, refresh)."""
RELATED_PAGE = 100
"""Issues per query when reading the state of blockers/children elsewhere (~7 points each)."""
CONNECTION_PAGE = 50
"""Blockers or children per follow-up query, for the rare issue with more than 10."""
PROJECTS_PAGE = 100
LABELS_PAGE = 250
POLL_WINDOW = 100
"""Issue changes one poll looks at; more means a full sync is cheaper and surer."""
POLL_COMMENTS = 50
POLL_RELATIONS = 25
"""Newest relation changes of the workspace one poll looks at; all of them new means
some may have been missed: then a full sync."""
POLL_OVERLAP = timedelta(minutes=2)
"""Changes Linear stamped this long before the newest one we hold are looked at again
(their ids and stamps only): a write that became visible late is not missed."""
SAVE_EVERY = timedelta(seconds=60)
"""A long-lived process saves the disk cache after polls at most this often."""


@dataclass(frozen=True)
class CreatePlan:
    """Where one new issue goes, decided for the whole batch before anything is created."""

    team: LinearTeam
    state: LinearState
    parent_id: str | None


class LinearTracker:
    """The issues of one Linear project, behind ``tracker.base.Tracker``."""

    def __init__(
        self,
        client: LinearClient,
        project: str,
        *,
        full_sync_interval: float = 1800.0,
        poll_interval: float = 30.0,
        page_size: int = PAGE_SIZE,
        labels: Labels | None = None,
        default_team: str | None = None,
        new_state: str | None = None,
        cache_file: Path | None = None,
    ) -> None:
        if not project or not str(project).strip():
            raise ConfigError("tracker.linear_project is empty: set a project id, slug or name")
        self.client = client
        self.project_ref = str(project).strip()
        self.full_sync_interval = full_sync_interval
        self.poll_interval = poll_interval
        self.page_size = page_size
        self.label_settings = labels or Labels()
        self.default_team = default_team
        self.new_state = new_state
        self.cache_file = cache_file
        self._project: LinearProject | None = None
        self._project_read_at: datetime | None = None
        self._labels: list[LinearLabel] | None = None
        self._cache: IssueCache | None = None
        self._disk_checked = False
        self._polled_at: datetime | None = None
        self._saved_at: datetime | None = None
        self._dirty = False
        self._expect_changes = False
        self._labels_missing: set[str] = set()
        """Label ids still unknown after the last reload (not reloaded for again)."""
        self._unreadable: set[str] = set()
        """Blockers/children Linear did not return when asked (not asked again until the
        next full sync); they stay unfinished for a decision, which is the safe side."""
        self.full_syncs = 0
        self.polls = 0
        self.cached_reads = 0

    @classmethod
    def from_settings(cls, settings: ProjectSettings, *, shared: bool = True,
                      **client_args: Any) -> LinearTracker:
        """``shared=False`` keeps no files (``init``, before the project exists)."""
        key = load_api_key(settings.tracker)
        url = os.environ.get(URL_ENV) or DEFAULT_URL
        state_dir = settings.paths.state_dir
        if shared:
            client_args.setdefault("shared_state", state_dir / RATE_FILE)
        client = LinearClient(key, url, **client_args)
        t = settings.tracker
        return cls(client, t.linear_project or "", full_sync_interval=t.full_sync_interval,
                   poll_interval=t.linear_poll_interval, labels=settings.labels,
                   default_team=t.linear_team, new_state=t.linear_new_state,
                   cache_file=state_dir / CACHE_FILE if shared else None)

    def __repr__(self) -> str:
        return f"LinearTracker({self.project_ref!r}, {self.client!r})"

    @property
    def clock(self) -> Callable[[], datetime]:
        return self.client.clock

    @property
    def project_file(self) -> Path | None:
        return self.cache_file.with_name(PROJECT_FILE) if self.cache_file else None

    def usage(self) -> dict[str, Any]:
        """For ``status``: requests/complexity per hour, rate limit, sync counts."""
        out = self.client.usage()
        cache = self._cache
        out.update(full_syncs=self.full_syncs, polls=self.polls, cached_reads=self.cached_reads,
                   last_full_sync=cache.synced_at.isoformat() if cache and cache.synced_at
                   else None,
                   cached_issues=len(cache.members()) if cache else 0)
        return out

    def expect_changes(self) -> None:
        """Something changed in Linear (a webhook said so): the next ``list_issues``
        polls even if the last poll is younger than ``poll_interval``."""
        self._expect_changes = True

    def renamed(self) -> dict[str, str]:
        """Earlier identifiers of the project's issues (before a team move) → current."""
        cache = self._cache
        if cache is None:
            return {}
        return {old: e.identifier for e in cache.members() for old in e.previous_identifiers}

    # --- project, teams, labels ------------------------------------------------------

    async def viewer(self) -> dict[str, str]:
        """Who the key belongs to (the auth check of ``init``)."""
        data = await self.client.execute("Viewer")
        with parsing("Viewer"):
            return {"id": str(data["viewer"]["id"]), "name": str(data["viewer"]["name"])}

    async def project(self) -> LinearProject:
        """The configured project, found by id, slug (or URL slug) or name; read from
        ``linear-project.json`` when an earlier process recorded it."""
        if self._project is not None:
            return self._project
        if self.project_file is not None:
            self._project = load_project(self.project_file, self.project_ref)
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
        return await self._read_project(found[0][0])

    async def _read_project(self, project_id: str) -> LinearProject:
        """The project's teams and their workflow states (re-read at each full sync)."""
        data = await self.client.execute("ProjectTeams", {"id": project_id})
        with parsing("ProjectTeams"):
            node = data["project"]
            truncated = node["teams"]["pageInfo"]["hasNextPage"] or any(
                t["states"]["pageInfo"]["hasNextPage"] for t in node["teams"]["nodes"])
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
            project = LinearProject(str(node["id"]), str(node["name"]), str(node["slugId"]),
                                    teams)
        if truncated:
            raise LinearSetupError(
                f"Linear project {project.name!r} has more than 25 teams or a team with more "
                "than 50 workflow states; ralph-dev does not handle that many"
            )
        self._project = project
        self._project_read_at = self.clock()
        if self._cache is not None:
            self._cache.project = project
        if self.project_file is not None:
            save_project(self.project_file, self.project_ref, project)
        log.info("linear_project", project=project.name, teams=[t.key for t in teams])
        return project

    def check_states(self, project: LinearProject) -> None:
        """Every team needs an unstarted, a started and a completed state (ralph-dev
        dispatches from the first and moves issues to the others), and the configured
        team and new-issue state must exist."""
        if not project.teams:
            raise LinearSetupError(
                f"Linear project {project.name!r} has no teams; add a team to it in Linear"
            )
        for team in project.teams:
            types = {s.type for s in team.states}
            missing = [t for t in ("unstarted", "started", "completed") if t not in types]
            if missing:
                raise LinearSetupError(
                    f"Linear team {team.name} ({team.key}) has no workflow state of type "
                    f"{' or '.join(missing)}; add one in Linear → Settings → Teams → "
                    f"{team.name} → Workflow"
                )
            if self.new_state and team.state(name=self.new_state, type=None) is None:
                raise LinearSetupError(
                    f"tracker.linear_new_state = {self.new_state!r}, but Linear team "
                    f"{team.key} has no such state (its states: {team.describe_states()}); "
                    "use a state name every team of the project has, or remove the setting"
                )
        if self.default_team and project.team(self.default_team) is None:
            raise LinearSetupError(self._team_choices(project, f"tracker.linear_team = "
                                                               f"{self.default_team!r} is not"))

    def _team_choices(self, project: LinearProject, what: str) -> str:
        keys = ", ".join(t.key for t in project.teams)
        return (f"{what} a team of Linear project {project.name!r} (its teams: {keys}); set "
                "tracker.linear_team to the key new issues without a parent go to")

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
        self._set_labels(out)
        return out

    def _set_labels(self, labels: list[LinearLabel]) -> None:
        self._labels = labels
        if self._cache is not None:
            self._cache.labels = {x.id: x for x in labels}

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
        self._set_labels([*(self._labels or []), label])
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

    # --- the cache ------------------------------------------------------------------

    async def _open_cache(self) -> IssueCache:
        """The cache: this process's, else the disk cache of the last full sync when it is
        fresh, else an empty one that knows only what is read into it."""
        if self._cache is not None:
            return self._cache
        project = await self.project()
        cache = None
        if self.cache_file is not None and not self._disk_checked:
            self._disk_checked = True
            cache = load_cache(self.cache_file, self.project_ref, project)
            if cache is not None and self._labels is None:
                self._labels = list(cache.labels.values())  # a stale list still names most
            if cache is not None and not self._fresh(cache):
                cache = None
            if cache is not None:
                log.info("linear_cache_loaded", issues=len(cache.members()),
                         synced_at=cache.synced_at.isoformat() if cache.synced_at else None)
                self._saved_at = self.clock()
        self._cache = cache or IssueCache(project)
        if self._labels is not None:
            self._cache.labels = {x.id: x for x in self._labels}
        return self._cache

    def _fresh(self, cache: IssueCache) -> bool:
        if cache.synced_at is None:
            return False
        age = (self.clock() - cache.synced_at).total_seconds()
        return 0 <= age < self.full_sync_interval

    def _save(self, *, force: bool = False) -> None:
        cache = self._cache
        if self.cache_file is None or cache is None or cache.synced_at is None:
            return  # only a cache that started from a full sync is worth sharing
        now = self.clock()
        if not force and self._saved_at is not None and now - self._saved_at < SAVE_EVERY:
            self._dirty = True
            return
        save_json(self.cache_file, cache.to_json(self.project_ref))
        self._saved_at = now
        self._dirty = False

    async def _complete(self, cache: IssueCache, entries: Iterable[Entry]) -> None:
        """Read what the entries' pages left out: the rest of long blocker/children lists,
        and the state of what they point at outside the project (or archived)."""
        for entry in entries:
            while entry.blockers_after is not None:
                data = await self.client.execute("IssueBlockers", {
                    "id": entry.id, "first": CONNECTION_PAGE, "after": entry.blockers_after})
                with parsing("IssueBlockers"):
                    more, entry.blockers_after = blockers_from(
                        data["issue"]["inverseRelations"])
                entry.blockers = (*entry.blockers, *more)
            while entry.children_after is not None:
                data = await self.client.execute("IssueChildren", {
                    "id": entry.id, "first": CONNECTION_PAGE, "after": entry.children_after})
                with parsing("IssueChildren"):
                    more, entry.children_after = children_from(data["issue"]["children"])
                entry.children = (*entry.children, *more)
        unknown = sorted(cache.unknown_references() - self._unreadable)
        self._unreadable.update(unknown)  # until Linear returns them (deleted, no access)
        short: list[str] = []
        for start in range(0, len(unknown), RELATED_PAGE):
            chunk = unknown[start:start + RELATED_PAGE]
            data = await self.client.execute("RelatedIssues", {"ids": chunk,
                                                               "first": len(chunk)})
            with parsing("RelatedIssues"):
                found = [entry_from_node(n) for n in data["issues"]["nodes"]]
            for entry in found:
                self._unreadable.discard(entry.id)
                if entry.project_id == cache.project.id and not entry.gone:
                    short.append(entry.id)  # one of ours after all: read it in full
                else:
                    cache.store(entry)
        if short:
            await self._complete(cache, await self._fetch_full(cache, short))
        missing = cache.unknown_label_ids()
        if missing - self._labels_missing:  # a label made since we read the list
            await self.labels(reload=True)
            self._labels_missing = cache.unknown_label_ids()

    async def _fetch_full(self, cache: IssueCache, ids: Sequence[str]) -> list[Entry]:
        """These issues in full, stored; returns what Linear still has."""
        fetched: list[Entry] = []
        for start in range(0, len(ids), BY_ID_PAGE):
            chunk = list(ids[start:start + BY_ID_PAGE])
            data = await self.client.execute("IssuesByIds", {"ids": chunk, "first": len(chunk)})
            with parsing("IssuesByIds"):
                fetched += [entry_from_node(n) for n in data["issues"]["nodes"]]
        for entry in fetched:
            cache.store(entry)
        return fetched

    # --- reading --------------------------------------------------------------------

    async def _full_sync(self) -> IssueCache:
        started = self.clock()
        project = await self.project()
        read_recently = (self._project_read_at is not None
                         and started - self._project_read_at < timedelta(minutes=1))
        if not read_recently:
            project = await self._read_project(project.id)
        fresh: list[Entry] = []
        mark = None
        after: str | None = None
        while True:
            data = await self.client.execute(
                "ProjectIssues",
                {"projectId": project.id, "first": self.page_size, "after": after})
            with parsing("ProjectIssues"):
                conn = data["issues"]
                fresh += [entry_from_node(n) for n in conn["nodes"]]
                if after is None:
                    marks = data["relationsMark"]["nodes"]
                    mark = parse_time(marks[0]["updatedAt"]) if marks else None
                more = bool(conn["pageInfo"]["hasNextPage"])
                after = conn["pageInfo"]["endCursor"]
            if not more:
                break
        old = self._cache
        self._unreadable.clear()
        cache = IssueCache(project, labels=old.labels if old else {})
        for entry in fresh:
            held = old.entries.get(entry.id) if old is not None else None
            if held is not None:
                newest_comments, entry.comments = entry.comments, dict(held.comments)
                entry.add_comments(newest_comments)
            cache.store(entry)
            cache.saw(entry.updated_at, *(c.created_at for c in entry.comments.values()))
        cache.relations_mark = mark
        self._cache = cache
        await self._complete(cache, fresh)
        cache.synced_at = cache.polled_at = self._polled_at = started
        self._expect_changes = False
        self.full_syncs += 1
        log.info("linear_full_sync", issues=len(cache.members()),
                 outside=len(cache.entries) - len(cache.members()))
        self._save(force=True)
        return cache

    def _poll_due(self, cache: IssueCache, now: datetime) -> bool:
        if self._polled_at is None or self._expect_changes:
            return True  # this process has not looked yet, or was told to
        if (now - self._polled_at).total_seconds() >= self.poll_interval:
            return True
        return self.client.writes_elsewhere_after(self._polled_at)

    async def _poll(self, cache: IssueCache) -> None:
        """One request; a second only for what is new; a full sync when it overflows."""
        started = self.clock()
        since = (cache.newest or started) - POLL_OVERLAP
        data = await self.client.execute("ProjectChanges", {
            "projectId": cache.project.id, "watch": sorted(cache.referenced()),
            "since": linear_time(since), "first": POLL_WINDOW, "commentsFirst": POLL_COMMENTS,
            "relationsFirst": POLL_RELATIONS})
        with parsing("ProjectChanges"):
            changed = [(str(n["id"]), parse_time(n["updatedAt"]))
                       for n in data["issues"]["nodes"]]
            archived = {str(n["id"]) for n in data["issues"]["nodes"] if n["archivedAt"]}
            comments = [(str(n["id"]), str(n["issue"]["id"])) for n in data["comments"]["nodes"]]
            comments_after = next_page(data["comments"])
            relations = [(parse_time(n["updatedAt"]), str(n["relatedIssue"]["id"]))
                         for n in data["issueRelations"]["nodes"]]
            overflow = ["issues"] if data["issues"]["pageInfo"]["hasNextPage"] else []
        while comments_after is not None:
            data = await self.client.execute("ProjectComments", {
                "projectId": cache.project.id, "since": linear_time(since),
                "first": POLL_COMMENTS, "after": comments_after})
            with parsing("ProjectComments"):
                comments += [(str(n["id"]), str(n["issue"]["id"]))
                             for n in data["comments"]["nodes"]]
                comments_after = next_page(data["comments"])
        mark = cache.relations_mark
        newer = [(stamp, target) for stamp, target in relations if mark is None or stamp > mark]
        if mark is not None and len(relations) == POLL_RELATIONS and len(newer) == len(relations):
            overflow.append("relations")
        if overflow:
            log.info("linear_poll_overflow", parts=overflow)
            await self._full_sync()
            return
        held, watched = cache.entries, cache.referenced()
        want = [i for i, stamp in changed  # archived and nothing of ours: nothing to read
                if (i not in held and (i not in archived or i in watched))
                or (i in held and held[i].updated_at != stamp)]
        members = {e.id for e in cache.members()}
        want += [target for _stamp, target in newer if target in members]  # relations moved
        want = list(dict.fromkeys(want))
        new_comments = [cid for cid, issue_id in comments
                        if issue_id not in cache.entries
                        or cid not in cache.entries[issue_id].comments]
        if want or new_comments:
            await self._details(cache, want, new_comments)
        if relations:
            cache.relations_mark = max([*(s for s, _t in relations),
                                        *([mark] if mark else [])])
        cache.saw(*(stamp for _issue_id, stamp in changed))
        cache.polled_at = self._polled_at = started
        self._expect_changes = False
        self.polls += 1
        if want or new_comments:
            cache.prune(recent=(cache.newest or started) - POLL_OVERLAP)
            self._save()

    async def _details(self, cache: IssueCache, ids: Sequence[str],
                       comment_ids: Sequence[str]) -> None:
        """The issues and comments a poll found new, in as few requests as the pages allow."""
        fetched: list[Entry] = []
        found: list[tuple[str, str, Comment]] = []
        rounds = max(-(-len(ids) // BY_ID_PAGE), -(-len(comment_ids) // POLL_COMMENTS), 1)
        for n in range(rounds):
            chunk = list(ids[n * BY_ID_PAGE:(n + 1) * BY_ID_PAGE])
            cchunk = list(comment_ids[n * POLL_COMMENTS:(n + 1) * POLL_COMMENTS])
            data = await self.client.execute("PollDetails", {
                "ids": chunk, "first": max(1, len(chunk)),
                "commentIds": cchunk, "commentsFirst": max(1, len(cchunk))})
            with parsing("PollDetails"):
                fetched += [entry_from_node(node) for node in data["issues"]["nodes"]]
                found += [(str(node["issue"]["id"]), *comment_from_node(node))
                          for node in data["comments"]["nodes"]]
        for entry in fetched:
            cache.store(entry)
        for issue_id, cid, comment in found:
            cache.add_comment(issue_id, cid, comment)
            cache.saw(comment.created_at)
        await self._complete(cache, fetched)

    async def list_issues(self) -> list[Issue]:
        """The project's issues, then the foreign blockers/children (``foreign=True``)."""
        cache = await self._open_cache()
        now = self.clock()
        if not self._fresh(cache):
            cache = await self._full_sync()
        elif self._poll_due(cache, now):
            await self._poll(cache)
        else:
            self.cached_reads += 1
        if self._dirty:
            self._save()
        return cache.issues()

    async def refresh(self, identifiers: Sequence[str]) -> list[Issue]:
        """These issues read again (the project's, and blockers/children elsewhere that
        the project's issues point at); unknown ones are left out."""
        wanted = [check_identifier(i) for i in identifiers]
        if not wanted:
            return []
        cache = await self._open_cache()
        known = {e.id: ident for ident in wanted if (e := cache.by_identifier(ident))}
        fetched = await self._fetch_full(cache, sorted(known))
        for gone in set(known) - {e.id for e in fetched}:  # deleted in Linear
            cache.forget(gone)
        for identifier in wanted:
            if identifier in known.values():
                continue
            try:
                data = await self.client.execute("Issue", {"id": identifier})
            except LinearNotFound:
                continue
            with parsing("Issue"):
                entry = entry_from_node(data["issue"])
            cache.store(entry)
            fetched.append(entry)
        await self._complete(cache, fetched)
        by_ident = {i.identifier: i for i in cache.issues()}
        renamed = {old: e.identifier for e in fetched for old in e.previous_identifiers}
        result = [by_ident.get(renamed.get(i, i)) for i in dict.fromkeys(wanted)]
        return [i for i in result if i is not None]

    async def get(self, identifier: str) -> Issue:
        """One issue of the project, read now (with its 20 newest comments)."""
        check_identifier(identifier)
        cache = await self._open_cache()
        held = cache.by_identifier(identifier)
        name = self._project.name if self._project else self.project_ref
        try:
            data = await self.client.execute("Issue", {"id": held.id if held else identifier})
        except LinearNotFound:
            if held is not None:
                cache.forget(held.id)
            raise UnknownIssue(f"no issue {identifier} in Linear project {name!r}") from None
        with parsing("Issue"):
            entry = entry_from_node(data["issue"])
        cache.store(entry)
        await self._complete(cache, [entry])
        if not cache.member(entry):
            where = "is archived or in the trash" if entry.gone else "is not in it"
            raise UnknownIssue(f"{identifier} {where} (Linear project {name!r})")
        return next(i for i in cache.issues() if i.id == entry.id)

    async def _ensure_full_view(self) -> IssueCache:
        """Everything (for checks over the whole project, such as blocker cycles)."""
        cache = await self._open_cache()
        return cache if self._fresh(cache) else await self._full_sync()

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
        edges: dict[str, set[str]] = {i.identifier: set(i.blocked_by) for i in cache.issues()}
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

    def _new_state(self, team: LinearTeam, asked: str | None) -> LinearState:
        """The entry's own state, else ``tracker.linear_new_state``, else the team's first
        "unstarted" state (Todo) — never Linear's default, which is a Backlog state that
        ralph-dev would never dispatch from."""
        name = asked or self.new_state
        state = team.state(name=name, type=None if name else StateType.UNSTARTED)
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
            plans[i] = CreatePlan(team, self._new_state(team, entry.state), parent_id)
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

