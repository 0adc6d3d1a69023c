"""Builds the real adapters for a project: the one place that knows all of them.

Every consumer receives its adapters through these functions, typed by the
ports it needs (``core.ports``); mypy checks here that each adapter really
provides them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ralph_dev.adapters.gh import Gh
from ralph_dev.adapters.host_admission import HostAdmission
from ralph_dev.adapters.jj import JjRepository
from ralph_dev.adapters.store import StateStore
from ralph_dev.adapters.tmux import Tmux
from ralph_dev.adapters.tracker import open_tracker
from ralph_dev.agent.launch import agent_bin_dir, build_launch
from ralph_dev.agent.probe import WorkerSetupCheck
from ralph_dev.control.loop.controller import Controller
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.ports import PullRequests, RemoteWorkers
from ralph_dev.hosts.bundle import kept_transcript
from ralph_dev.hosts.hooks import Hooks
from ralph_dev.hosts.local import LocalHost

if TYPE_CHECKING:  # Ray is imported only for a project with a cluster
    from ralph_dev.hosts.ray.host import RayHost


def tmux_for(settings: ProjectSettings) -> Tmux:
    return Tmux.from_settings(settings)


def host_for(settings: ProjectSettings, repository: JjRepository | None = None,
             store: StateStore | None = None,
             settings_now: Callable[[], ProjectSettings] | None = None
             ) -> LocalHost | RayHost:
    """Where the project's workers run: this host's tmux and jj, or its cluster's hosts
    with the controller's side of them (what hosts start from, what comes back).
    ``settings_now``: the settings in force (a running controller's change live)."""
    if settings.cluster is not None:
        return ray_host_for(settings, repository, store, settings_now)
    records = store or StateStore(settings.paths)
    hooks, hook_failed = _hooks(settings, records, settings_now)
    return LocalHost(tmux_for(settings), (repository or jj_for(settings)).workspaces,
                     hooks=hooks, hook_failed=hook_failed,
                     settings=settings_now or (lambda: settings),
                     admission=HostAdmission(settings.name))


def ray_host_for(settings: ProjectSettings, repository: JjRepository | None = None,
                 store: StateStore | None = None,
                 settings_now: Callable[[], ProjectSettings] | None = None) -> RayHost:
    """The project's cluster as its worker host. Ray is imported only here, and only
    for a project with a ``[cluster]`` table."""
    from ralph_dev.hosts.ray.host import RayHost
    from ralph_dev.hosts.ray.plane import RayPlane

    repository = repository or jj_for(settings)
    records = store or StateStore(settings.paths)
    hooks, hook_failed = _hooks(settings, records, settings_now)

    def attempt_of(issue: str) -> int:
        record = records.load_record(issue)
        return record.host_attempt if record is not None else 0

    return RayHost(RayPlane.from_settings(settings), repository.cli, repository.workspaces,
                   trunk=settings.trunk, attempt_of=attempt_of, hooks=hooks,
                   hook_failed=hook_failed, log_path=records.log_path,
                   kept_transcript=lambda issue, session: kept_transcript(
                       settings.paths.worker_dir(issue), session),
                   say=records.append_event,
                   lease_renewed=lambda issue, at: records.note_facts(
                       issue, "carrier", lease_renewed_at=at),
                   merge_remote=settings.merge.remote,
                   agent_bin=agent_bin_dir(settings),
                   ledger_dir=settings.paths.worker_dir
                   if settings.agent.network == "allowlist" else None)


def remote_workers_for(settings: ProjectSettings, store: StateStore | None = None
                       ) -> RemoteWorkers | None:
    """What a person's commands reach of workers on other hosts (None: they run here)."""
    return None if settings.cluster is None else ray_host_for(settings, store=store)


def _hooks(settings: ProjectSettings, records: StateStore,
           settings_now: Callable[[], ProjectSettings] | None) -> tuple[
               Callable[[str], Hooks], Callable[[str, int, Path], None]]:
    def hooks(issue: str) -> Hooks:
        now = settings_now() if settings_now is not None else settings
        return Hooks.of(now, issue, records.log_path(issue))

    def hook_failed(issue: str, exit_code: int, log: Path) -> None:
        records.append_event("workspace_hook_failed", issue=issue, hook="before_remove",
                             exit_code=exit_code, log=str(log))

    return hooks, hook_failed


def jj_for(settings: ProjectSettings) -> JjRepository:
    return JjRepository.from_settings(settings)


def controller_for(settings: ProjectSettings) -> Controller:
    repository = jj_for(settings)
    store = StateStore(settings.paths)
    pull_requests: PullRequests = Gh(settings.merge.gh_bin, settings.repo)
    built: list[Controller] = []
    controller = Controller(
        settings,
        tracker=open_tracker(settings),
        host=host_for(settings, repository, store,
                      settings_now=lambda: built[0].settings if built else settings),
        jj=repository,
        launcher=build_launch,
        pull_requests=pull_requests,
        store=store,
        agent_check=WorkerSetupCheck(),
    )
    built.append(controller)
    return controller
