"""The Linear tracker's foundation: its client, and the project, teams and labels it reads.

``LinearTracker`` (tracker.py) is built in three layers: this one (who we are,
the project's teams, their workflow states and labels), ``reading.py`` (the
issue cache: full syncs, cheap polls, the disk cache other processes share) and
``tracker.py`` (writes: states, labels, comments, blockers, new issues).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import structlog

from ralph_dev.adapters.tracker.linear.apikey import load_api_key
from ralph_dev.adapters.tracker.linear.cache import (
    CACHE_FILE,
    PROJECT_FILE,
    RATE_FILE,
    IssueCache,
    load_project,
    save_project,
)
from ralph_dev.adapters.tracker.linear.client import DEFAULT_URL, URL_ENV, LinearClient
from ralph_dev.adapters.tracker.linear.errors import LinearSetupError
from ralph_dev.adapters.tracker.linear.parse import (
    LinearLabel,
    LinearProject,
    LinearState,
    LinearTeam,
    parsing,
)
from ralph_dev.core.config import Labels
from ralph_dev.core.errors import (
    ConfigError,
    TrackerInputError,
)
from ralph_dev.core.model import InvalidLabel, check_label

if TYPE_CHECKING:
    from ralph_dev.core.config import ProjectSettings


log = structlog.get_logger(__name__)

PAGE_SIZE = 60
"""Issues per full-sync page: IssueFields is about 71 points, so about 4,300 per query
(under 5,000; Linear refuses anything over 10,000)."""
PROJECTS_PAGE = 100
LABELS_PAGE = 250
BY_ID_PAGE = 50
"""Issues per query when fetching known ids in full (polls, refresh)."""
RELATED_PAGE = 100
"""Issues per query when reading the state of blockers/children elsewhere (~7 points each)."""
CONNECTION_PAGE = 50
"""Blockers or children per follow-up query, for the rare issue with more than 10."""
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



class LinearBase:
    """The issues of one Linear project, behind ``core.ports.Tracker``."""

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
                      **client_args: Any) -> Self:
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
            try:
                name = check_label(name)
            except InvalidLabel as exc:
                raise TrackerInputError(str(exc)) from None
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

