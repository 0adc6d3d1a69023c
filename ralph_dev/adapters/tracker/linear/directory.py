"""The Linear project as configured: its teams and their workflow states, and the labels.

``ProjectDirectory`` answers "which project, which team, which state, which
label id" for the reader and the writer of one ``LinearTracker``; it is read
once per process (``linear-project.json`` spares short-lived processes even
that) and again at each full sync. ``init`` uses it alone, before any issue is
read, to check that the project is usable as configured.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

import structlog

from ralph_dev.adapters.tracker.linear.cache import load_project, save_project
from ralph_dev.adapters.tracker.linear.client import LinearClient
from ralph_dev.adapters.tracker.linear.errors import LinearSetupError
from ralph_dev.adapters.tracker.linear.parse import (
    LinearLabel,
    LinearProject,
    LinearState,
    LinearTeam,
    parsing,
)
from ralph_dev.core.errors import ConfigError, TrackerInputError
from ralph_dev.core.model import InvalidLabel, StateType, check_label

log = structlog.get_logger(__name__)

PROJECTS_PAGE = 100
LABELS_PAGE = 250

LabelsChanged = Callable[[list[LinearLabel]], None]
"""Told every label list the directory reads or grows, so the issue cache names them."""


def _listed(words: Sequence[str], last: str) -> str:
    """``A, B and C`` (``last`` = "and") or ``A, B or C``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} {last} {words[-1]}"


def describe_teams(project: LinearProject) -> str:
    """The project's teams as a person reads them: ``ENG (Engineering) and OPS (Ops)``."""
    return _listed([f"{t.key} ({t.name})" for t in project.teams], "and")


def team_keys(project: LinearProject, last: str = "or") -> str:
    """``ENG or OPS``."""
    return _listed([t.key for t in project.teams], last)


def team_needed(project: LinearProject, fix: str | None = None) -> str:
    """Why a project of several teams needs ``tracker.linear_team``, and ``fix``: how to
    set it (by default, in the config)."""
    fix = fix or (f"set tracker.linear_team to {team_keys(project)} in the project's config "
                  "(`ralph-dev init … --linear-team KEY --force` writes it)")
    return (f"Linear project {project.name!r} has {len(project.teams)} teams, "
            f"{describe_teams(project)}, and ralph-dev does not know which of them gets the "
            f"new issues that have no parent: {fix}")


class ProjectDirectory:
    """One Linear project's teams, workflow states and labels, over one client."""

    def __init__(self, client: LinearClient, project_ref: str, *,
                 default_team: str | None = None, new_state: str | None = None,
                 project_file: Path | None = None,
                 labels_changed: LabelsChanged | None = None) -> None:
        if not project_ref or not str(project_ref).strip():
            raise ConfigError("tracker.linear_project is empty: set a project id, slug or name")
        self.client = client
        self.project_ref = str(project_ref).strip()
        self.default_team = default_team
        self.new_state = new_state
        self.project_file = project_file
        self.labels_changed = labels_changed
        self.project_read_at: datetime | None = None
        self._project: LinearProject | None = None
        self._labels: list[LinearLabel] | None = None

    @property
    def known(self) -> LinearProject | None:
        """The project if this process has looked it up already (no request)."""
        return self._project

    @property
    def labels_known(self) -> list[LinearLabel] | None:
        """The labels if this process has a list of them already (no request)."""
        return self._labels

    def adopt_labels(self, labels: list[LinearLabel]) -> None:
        """Labels a disk cache named: a stale list still names most, and saves a request."""
        if self._labels is None:
            self._labels = labels

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
        return await self.read_project(found[0][0])

    async def read_project(self, project_id: str) -> LinearProject:
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
        self.project_read_at = self.client.clock()
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
        if self.default_team:
            self.team_for_new_issues(project)

    def team_for_new_issues(self, project: LinearProject) -> LinearTeam:
        """Where an issue without a parent goes: ``tracker.linear_team``, else the
        project's only team; several teams and no setting is an error naming them."""
        if self.default_team:
            team = project.team(self.default_team)
            if team is None:
                raise LinearSetupError(
                    f"tracker.linear_team = {self.default_team!r} is not a team of Linear "
                    f"project {project.name!r}, whose teams are {describe_teams(project)}: "
                    f"set tracker.linear_team to {team_keys(project)}")
            return team
        if len(project.teams) == 1:
            return project.teams[0]
        if not project.teams:
            raise LinearSetupError(f"Linear project {project.name!r} has no teams; add one")
        raise LinearSetupError(team_needed(project))

    def state_for_new_issue(self, team: LinearTeam, asked: str | None,
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
        if self.labels_changed is not None:
            self.labels_changed(labels)

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

    async def label_ids(self, names: Sequence[str], team_id: str) -> list[str]:
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

