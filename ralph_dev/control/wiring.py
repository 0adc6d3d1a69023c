"""Builds the real adapters for a project: the one place that knows all of them.

Every consumer receives its adapters through these functions, typed by the
ports it needs (``core.ports``); mypy checks here that each adapter really
provides them.
"""

from __future__ import annotations

from ralph_dev.adapters.gh import Gh
from ralph_dev.adapters.jj import JjRepository
from ralph_dev.adapters.store import StateStore
from ralph_dev.adapters.tmux import Tmux
from ralph_dev.adapters.tracker import open_tracker
from ralph_dev.agent.launch import build_launch
from ralph_dev.agent.probe import WorkerSetupCheck
from ralph_dev.control.controller import Controller
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import ConfigError
from ralph_dev.core.ports import ProcessPlane, PullRequests, Repository, Session


def tmux_for(settings: ProjectSettings) -> Tmux:
    return Tmux.from_settings(settings)


def plane_for(settings: ProjectSettings) -> ProcessPlane:
    """Where the project's workers run: this host's tmux, or its cluster's hosts. Ray is
    imported only here and only for a project with a ``[cluster]`` table."""
    if settings.cluster is None:
        return tmux_for(settings)
    from ralph_dev.adapters.ray_plane import RayPlane
    return RayPlane.from_settings(settings)


def jj_for(settings: ProjectSettings) -> JjRepository:
    return JjRepository.from_settings(settings)


def refuse_cluster(settings: ProjectSettings) -> None:
    """The swarm does not run on a cluster yet: a worker's workspace, its agent's launch
    and its mailbox are still this host's, and a cluster worker would run without them.
    Said at ``start`` (and by a controller started any other way), never half-run."""
    if settings.cluster is not None:
        raise ConfigError(
            f"projects.{settings.name}.cluster: the controller does not place workers on a "
            "cluster yet (only the process plane does, see issue 26); remove the [cluster] "
            "table to run every worker on this host")


def controller_for(settings: ProjectSettings) -> Controller:
    refuse_cluster(settings)
    session: Session = tmux_for(settings)
    repository: Repository = jj_for(settings)
    pull_requests: PullRequests = Gh(settings.merge.gh_bin, settings.repo)
    return Controller(
        settings,
        tracker=open_tracker(settings),
        tmux=session,
        jj=repository,
        launcher=build_launch,
        pull_requests=pull_requests,
        store=StateStore(settings.paths),
        agent_check=WorkerSetupCheck(),
    )
