"""``ralph-dev init … --tracker linear``: check everything before a config is written.

``init`` writes the project's table only after ``prepare_linear`` returns, so a
wrong key, an unknown project or a team without the states ralph-dev needs
leaves the config untouched. Missing steering labels are created (that is the
one write to Linear, and it is idempotent: labels that exist are left alone),
and the project's teams are recorded in the state dir so ``issue show ENG-12``
finds the project by any of its team keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from ralph_dev.adapters.tracker.linear.cache import PROJECT_FILE, save_project
from ralph_dev.adapters.tracker.linear.parse import LinearProject
from ralph_dev.adapters.tracker.linear.tracker import LinearTracker
from ralph_dev.core.text import terminal_line

if TYPE_CHECKING:
    from ralph_dev.core.config import ProjectSettings


@dataclass(frozen=True)
class LinearSetup:
    viewer: str
    project: str
    teams: tuple[str, ...]
    labels_created: tuple[str, ...]
    linear_project: LinearProject
    project_ref: str

    def record(self, settings: ProjectSettings) -> None:
        """Remember the project's teams (once its config is written)."""
        save_project(settings.paths.state_dir / PROJECT_FILE, self.project_ref,
                     self.linear_project)


async def prepare_linear(settings: ProjectSettings, *, echo: bool = True) -> LinearSetup:
    """Auth check (viewer), project lookup, per-team states, steering labels."""
    tracker = LinearTracker.from_settings(settings, shared=False)
    try:
        viewer = await tracker.viewer()
        project = await tracker.project()
        tracker.check_states(project)
        created = await tracker.ensure_labels(settings.labels.steering())
    finally:
        await tracker.close()

    setup = LinearSetup(
        viewer=viewer["name"],
        project=project.name,
        teams=tuple(t.key for t in project.teams),
        labels_created=tuple(created),
        linear_project=project,
        project_ref=tracker.project_ref,
    )
    if echo:
        # names from Linear: shown through the terminal sanitizer
        click.echo(terminal_line(f"Linear: signed in as {setup.viewer}; project "
                                 f"{setup.project!r} (teams {', '.join(setup.teams)})"))
        if created:
            click.echo(f"Created labels: {', '.join(created)}")
    return setup
