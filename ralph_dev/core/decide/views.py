"""What ``status``, the dashboard and ``plan`` show of the decision core: the role a worker
would get, what is ready, what is blocked, and each issue's board column."""

from __future__ import annotations

from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.decide.world import World, dispatch_key, label_set, ready_in
from ralph_dev.core.model import Issue, Observed, Role, StateType

# --- public helpers for status / plan ------------------------------------------------


def route(issue: Issue, observed: Observed, settings: ProjectSettings) -> Role:
    """The role a worker for ``issue`` gets (rule 7).

    Looks only at what routing needs (the issue's workspace and children), so
    ``status`` may call it once per worker without indexing the whole world.
    """
    ident = issue.identifier
    world = World(observed, settings)
    world.labels[ident] = label_set(issue.labels)
    kids = set(issue.children) | {i.identifier for i in observed.issues if i.parent == ident}
    if kids:
        world.children[ident] = kids
    ws = next((w for w in observed.workspaces if w.name == ident), None)
    if ws is not None:
        world.workspaces[ident] = ws
    return world.route(issue)


def ready_issues(observed: Observed, settings: ProjectSettings) -> tuple[Issue, ...]:
    """Issues a new worker would start on, in dispatch order, before limits."""
    world = World.build(observed, settings)
    return ready_in(world)


def blocked_issues(observed: Observed, settings: ProjectSettings) -> tuple[Issue, ...]:
    """Unfinished issues waiting on an unfinished blocker (their own or an ancestor's)."""
    world = World.build(observed, settings)
    found = [
        issue
        for issue in world.issues.values()
        if not issue.foreign and not issue.state_type.finished
        and world.blocker_of(issue) is not None
    ]
    return tuple(sorted(found, key=dispatch_key))


COLUMNS = ("held", "ready", "running", "blocked", "waiting", "done")
"""Where ``status`` and the dashboard put each issue: held (a person must act), ready
(dispatch takes it when a slot frees), running (started or has a live worker), blocked
(an unsettled blocker), waiting (anything else unfinished: a parent waiting for its
children, a backlog state, a finished worker waiting for its merge), done (finished)."""


def issue_columns(observed: Observed, settings: ProjectSettings
                  ) -> dict[str, tuple[str, str | None]]:
    """Each issue's column (one of ``COLUMNS``) and, for a blocked one, the first
    unsettled issue that blocks it (its own blocker or an ancestor's)."""
    world = World.build(observed, settings)
    ready = {issue.identifier for issue in ready_in(world)}
    columns: dict[str, tuple[str, str | None]] = {}
    for ident, issue in world.issues.items():
        if issue.foreign:
            continue
        blocker = None
        if world.held(ident) and issue.state_type == StateType.COMPLETED:
            column = "held"  # Done in the tracker, but held for a person: never shown as done
        elif issue.state_type.finished:
            column = "done"
        elif world.held(ident):
            column = "held"
        elif ident in ready:
            column = "ready"
        elif world.live(ident) or issue.state_type == StateType.STARTED:
            column = "running"
        elif (blocker := world.blocker_of(issue)) is not None:
            column = "blocked"
        else:
            column = "waiting"
        columns[ident] = (column, blocker)
    return columns


