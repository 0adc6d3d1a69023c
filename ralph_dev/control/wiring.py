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
from ralph_dev.core.ports import PullRequests, Repository, Session


def tmux_for(settings: ProjectSettings) -> Tmux:
    return Tmux.from_settings(settings)


def jj_for(settings: ProjectSettings) -> JjRepository:
    return JjRepository.from_settings(settings)


def controller_for(settings: ProjectSettings) -> Controller:
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
