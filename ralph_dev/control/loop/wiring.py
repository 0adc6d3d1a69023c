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
from ralph_dev.control.loop.controller import Controller
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.ports import Cluster, ProcessPlane, PullRequests


def tmux_for(settings: ProjectSettings) -> Tmux:
    return Tmux.from_settings(settings)


def plane_for(settings: ProjectSettings, repository: JjRepository | None = None,
              store: StateStore | None = None) -> tuple[ProcessPlane, Cluster | None]:
    """Where the project's workers run: this host's tmux, or its cluster's hosts with the
    controller's side of them (what hosts start from, what comes back). Ray is imported
    only here and only for a project with a ``[cluster]`` table."""
    if settings.cluster is None:
        return tmux_for(settings), None
    from ralph_dev.adapters.pushed_work import ClusterWork
    from ralph_dev.adapters.ray_plane import RayPlane
    from ralph_dev.agent.launch import agent_bin_dir
    plane = RayPlane.from_settings(settings)
    repository = repository or jj_for(settings)
    records = store or StateStore(settings.paths)

    def attempt_of(issue: str) -> int:
        record = records.load_record(issue)
        return record.cluster_attempt if record is not None else 0

    return plane, ClusterWork(plane, repository.cli, trunk=settings.trunk,
                              attempt_of=attempt_of, merge_remote=settings.merge.remote,
                              agent_bin=agent_bin_dir(settings))


def jj_for(settings: ProjectSettings) -> JjRepository:
    return JjRepository.from_settings(settings)


def controller_for(settings: ProjectSettings) -> Controller:
    repository = jj_for(settings)
    store = StateStore(settings.paths)
    plane, cluster = plane_for(settings, repository, store)
    pull_requests: PullRequests = Gh(settings.merge.gh_bin, settings.repo)
    return Controller(
        settings,
        tracker=open_tracker(settings),
        tmux=plane,
        jj=repository,
        launcher=build_launch,
        pull_requests=pull_requests,
        store=store,
        cluster=cluster,
        agent_check=WorkerSetupCheck(),
    )
