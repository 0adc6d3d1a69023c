"""``ralph-dev init … --tracker linear``: check everything before a config is written.

``init`` writes the project's table only after ``prepare_linear`` returns, so a
wrong key, an unknown project, a team without the states ralph-dev needs, or a
project of several teams with no team chosen for new issues leaves the config
untouched. Missing steering labels are created (that is the one write to
Linear, and it is idempotent: labels that exist are left alone), and the
project's teams are recorded in the state dir so ``issue show ENG-12`` finds
the project by any of its team keys.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from ralph_dev.adapters.tracker.linear.cache import PROJECT_FILE, save_project
from ralph_dev.adapters.tracker.linear.directory import describe_teams, team_keys, team_needed
from ralph_dev.adapters.tracker.linear.errors import LinearSetupError
from ralph_dev.adapters.tracker.linear.parse import LinearProject
from ralph_dev.adapters.tracker.linear.tracker import LinearTracker
from ralph_dev.core.text import terminal_line

if TYPE_CHECKING:
    from ralph_dev.core.config import ProjectSettings

TeamChooser = Callable[[LinearProject], str]
"""Asks a person which team of the project gets new issues; returns its key."""


@dataclass(frozen=True)
class LinearSetup:
    viewer: str
    project: str
    teams: tuple[str, ...]
    labels_created: tuple[str, ...]
    linear_project: LinearProject
    project_ref: str
    team: str | None
    """The team new issues without a parent go to, when the project has several."""

    def record(self, settings: ProjectSettings) -> None:
        """Remember the project's teams (once its config is written)."""
        save_project(settings.paths.state_dir / PROJECT_FILE, self.project_ref,
                     self.linear_project)


def ask_team(project: LinearProject) -> str:
    """The prompt ``init`` shows on a terminal for a project of several teams."""
    click.echo(f"Linear project {project.name!r} has {len(project.teams)} teams: "
               f"{describe_teams(project)}.")
    return str(click.prompt(
        "Which team gets the new issues that have no parent (tracker.linear_team)?",
        type=click.Choice([t.key for t in project.teams], case_sensitive=False)))


def _team(settings: ProjectSettings, project: LinearProject,
          choose: TeamChooser | None) -> str | None:
    """The team for new issues: configured, the only one, or chosen now; else refuse."""
    if settings.tracker.linear_team or len(project.teams) < 2:
        return settings.tracker.linear_team
    if choose is None:
        raise LinearSetupError(team_needed(project, (
            f"run init again with --linear-team {team_keys(project)} (it sets "
            "tracker.linear_team); nothing was written")))
    return choose(project)


async def prepare_linear(settings: ProjectSettings, *, echo: bool = True,
                         choose_team: TeamChooser | None = None) -> LinearSetup:
    """Auth check (viewer), project lookup, per-team states, the team for new issues
    (``choose_team`` asks a person when the project has several and none is set),
    steering labels."""
    tracker = LinearTracker.from_settings(settings, shared=False)
    directory = tracker.directory
    try:
        viewer = await directory.viewer()
        project = await directory.project()
        directory.check_states(project)
        team = _team(settings, project, choose_team)
        created = await directory.ensure_labels(settings.labels.steering())
    finally:
        await tracker.close()

    setup = LinearSetup(
        viewer=viewer["name"],
        project=project.name,
        teams=tuple(t.key for t in project.teams),
        labels_created=tuple(created),
        linear_project=project,
        project_ref=directory.project_ref,
        team=team,
    )
    if echo:
        # names from Linear: shown through the terminal sanitizer
        click.echo(terminal_line(f"Linear: signed in as {setup.viewer}; project "
                                 f"{setup.project!r} (teams {', '.join(setup.teams)})"
                                 + (f"; new issues go to {setup.team}" if setup.team else "")))
        if created:
            click.echo(f"Created labels: {', '.join(created)}")
    return setup
