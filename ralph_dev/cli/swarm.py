"""Commands that run or preview the swarm: controller, start, stop, plan."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import click

from ralph_dev.cli import CliContext, echo_json, main, pass_ctx, project_argument, run
from ralph_dev.core.actions import Action, Plan, Restart, Spawn
from ralph_dev.core.agent_profiles import SUPPORTED, aware_roles
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import ConfigError, RalphError
from ralph_dev.core.model import Workspace, worker_windows
from ralph_dev.core.ports import WorkspaceLister
from ralph_dev.core.text import terminal_line


@main.command()
@project_argument
@click.option("--once", is_flag=True, help="Run a single tick and exit (for debugging).")
@pass_ctx
def controller(cli: CliContext, project: str, once: bool) -> None:
    """Run PROJECT's controller loop (normally inside the daemon's tmux window)."""
    import structlog

    from ralph_dev.adapters import logs
    from ralph_dev.control.loop.run import controller_lock, run_with_webhooks
    from ralph_dev.control.loop.wiring import controller_for

    # the daemon read the config valid before it started us: an edit since that left the
    # file invalid does not stop the swarm (the last good config runs, and it is said)
    settings, error, seen = cli.project_to_run(project)
    logs.configure("INFO", json_file=settings.paths.logs_dir / "controller.jsonl")
    structlog.contextvars.bind_contextvars(project=project)
    with controller_lock(settings.paths.controller_lock):
        ctl = controller_for(settings)
        ctl.config.started_with(seen, error)  # an edit since the read is read at once
        # with tracker.webhook_port set, a Linear webhook listener wakes the tick early
        run(run_with_webhooks(ctl, max_ticks=1 if once else None))


@main.command()
@project_argument
@pass_ctx
def reload(cli: CliContext, project: str) -> None:
    """Read PROJECT's config again now (the controller also notices an edit by itself
    within a tick); an invalid file is refused and the last good config keeps running."""
    from ralph_dev.adapters.processes import lock_holder
    from ralph_dev.adapters.store import StateStore
    from ralph_dev.adapters.wake import poke
    from ralph_dev.control.loop.config_watch import request_reload

    settings, error = cli.project_as_running(project)
    if error is not None:
        raise ConfigError(f"{error}\nNothing was reloaded: the swarm goes on with the last "
                          "good config; fix the file and run this again")
    store = StateStore(settings.paths)
    request_reload(store)
    daemon = lock_holder(settings.paths.daemon_pid)
    if daemon and daemon > 0:
        os.kill(daemon, signal.SIGHUP)  # the daemon's own settings (notifications)
    told = poke(store)
    click.echo(f"asked {project}'s controller to read {cli.config_path} again"
               + ("" if told else " (it is not running: it reads it when it starts)")
               + "; `ralph-dev events` shows what changed.")


def every_project(cli: CliContext, project: str | None, everyone: bool, verb: str,
                  done: str, one: Callable[[str], None]) -> None:
    """``one`` for PROJECT, or with ``--all`` for each configured project in turn: one that
    fails is said and the others go on; the command then fails, naming them."""
    if everyone == (project is not None):
        raise click.UsageError(f"name a PROJECT to {verb}, or --all for every configured "
                               "project")
    if project is not None:
        one(project)
        return
    names = cli.project_names_to_read()
    if not names:
        raise ConfigError("no projects configured yet: run `ralph-dev init PROJECT --repo PATH`")
    failed = []
    for name in names:
        try:
            one(name)
        except (RalphError, click.ClickException) as exc:
            message = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
            click.echo(f"{name}: not {done}: {message}", err=True)
            failed.append(name)
    if failed:
        raise click.ClickException(f"{len(failed)} of {len(names)} projects were not {done} "
                                   f"({', '.join(failed)}): see above why")


@main.command()
@click.argument("project", envvar="RALPH_DEV_PROJECT", required=False)
@click.option("--all", "everyone", is_flag=True, help="Every configured project.")
@click.option("--foreground", is_flag=True, help="Stay attached (what systemd runs).")
@pass_ctx
def start(cli: CliContext, project: str | None, everyone: bool, foreground: bool) -> None:
    """Start PROJECT (or --all): tmux session, controller window, health loop."""
    if foreground and everyone:
        raise click.UsageError("--foreground runs one project's daemon (one systemd unit "
                               "each): name the PROJECT")
    every_project(cli, project, everyone, "start", "started",
                  lambda name: _start(cli, name, foreground))


def _start(cli: CliContext, project: str, foreground: bool) -> None:
    from ralph_dev.adapters.processes import start_background
    from ralph_dev.agent.probe import try_worker_sandbox
    from ralph_dev.control.daemon.daemon import Daemon
    from ralph_dev.control.loop.wiring import jj_for, tmux_for

    # a service's daemon waits for a fixed config; a person at `start` is told at once
    settings, seen = cli.project_when_valid(project) if foreground \
        else (cli.project(project), None)
    jj_for(settings).trunk.check_repo()
    if not foreground:
        # a person is here to read why: every worker would fail the same way. (A service
        # starts anyway; its controller pauses dispatch and says so until it is fixed.)
        # Nothing here waits on the agent: the command runner's is never run, and Claude
        # Code's `--version` is left to the controller, which runs it beside its loop.
        try_worker_sandbox(settings, run_agent=False)
        _check_cluster(settings)
        pid = start_background(settings)
        click.echo(f"ralph-dev started for {project} (daemon pid {pid}).")
        click.echo(f"  watch:  ralph-dev status {project}")
        if settings.web.enabled:
            click.echo(f"  dashboard: {_dashboard_login(settings, pid)}")
        socket = f" -L {settings.tmux_socket}" if settings.tmux_socket else ""
        click.echo(f"  attach: tmux{socket} attach -t {settings.session_name}")
        return
    from ralph_dev.adapters import logs

    logs.configure("INFO", json_file=settings.paths.logs_dir / "daemon.jsonl")
    daemon = Daemon(settings, tmux=tmux_for(settings))
    daemon.config.started_with(seen, None)  # an edit since the read is read at once
    asyncio.run(daemon.run())


def _check_cluster(settings: ProjectSettings) -> None:
    """A cluster project's cluster, reachable and with slots, before its daemon starts."""
    if settings.cluster is None:
        return
    from ralph_dev.control.checks.doctor import cluster_checks

    failed = [f"{c.name}: {c.detail}" for c in cluster_checks(settings) if not c.ok]
    if failed:
        raise click.ClickException("the cluster is not ready:\n  " + "\n  ".join(failed))


DASHBOARD_WAIT = 15.0
"""Seconds ``start`` waits for the new daemon to serve its dashboard before it leaves
the login link to ``status``."""


def _dashboard_login(settings: ProjectSettings, pid: int) -> str:
    """The new daemon's one-time login link, once it serves the dashboard (or why not)."""
    from ralph_dev.control.daemon.web.access import login_url, served

    deadline = time.monotonic() + DASHBOARD_WAIT
    while time.monotonic() < deadline:
        said = served(settings.paths)
        if said.get("pid") == pid:
            if not said.get("url"):
                return f"not served: {said.get('error')}"
            link = login_url(settings.paths)
            if link:
                return f"{link}  (works once; `ralph-dev status` prints a new one)"
        time.sleep(0.1)
    return f"not up yet: `ralph-dev status {settings.name}` prints its login link"


@main.command()
@click.argument("project", envvar="RALPH_DEV_PROJECT", required=False)
@click.option("--all", "everyone", is_flag=True, help="Every configured project.")
@click.option("--workers", is_flag=True,
              help="Also stop the workers (their workspaces are snapshotted first) and the "
                   "merge lane's verify.")
@pass_ctx
def stop(cli: CliContext, project: str | None, everyone: bool, workers: bool) -> None:
    """Stop PROJECT's (or --all) daemon and controller; workers (and the merge lane's
    verify) keep running unless --workers."""
    every_project(cli, project, everyone, "stop", "stopped",
                  lambda name: _stop(cli, name, workers))


def _stop(cli: CliContext, project: str, workers: bool) -> None:
    from ralph_dev.adapters.processes import stop_controller_window, stop_daemon
    from ralph_dev.adapters.store import StateStore
    from ralph_dev.adapters.systemd import stop_unit_if_active
    from ralph_dev.control.loop.merging import stop_lane
    from ralph_dev.control.loop.wiring import host_for, tmux_for

    settings = cli.project_or_last_good(project)  # a bad edit does not keep it running
    if stop_unit_if_active(project):  # under systemd, Restart=always would undo a SIGTERM
        click.echo(f"stopped the systemd unit ralph-dev@{project}")
    pid = stop_daemon(settings)
    stop_controller_window(tmux_for(settings))
    click.echo(f"stopped daemon pid {pid}" if pid else "no daemon was running")
    if workers:
        store = StateStore(settings.paths)
        host = host_for(settings, store=store)
        for window in worker_windows(host.list_windows()):
            record = store.load_record(window.name)
            try:  # what it did is kept: recorded here, or pushed from its host as it ends
                host.changes.snapshot(window.name)
                host.end(window.name, record.host_attempt if record else 0,
                         [window.window_id], bring_in=False,
                         session=record.session_id if record else None)
            except RalphError as exc:
                click.echo(f"warning: could not keep what {window.name} did: {exc}", err=True)
                host.end(window.name, 0, [window.window_id], bring_in=False, session=None)
            store.append_event("worker_stopped", issue=window.name,
                               reason="ralph-dev stop --workers")
            click.echo(f"stopped worker {window.name}")
        if stop_lane(settings.paths.lane_dir):
            click.echo("stopped the merge lane's verify (it runs again at the next start)")


def action_json(action: Action) -> dict[str, Any]:
    return {"action": action.kind, "issue": action.issue, "reason": action.reason,
            **action.details()}


class _NoWorkspaces:
    """What ``plan`` observes of jj when the repository cannot be read: nothing."""

    def list_workspaces(self) -> list[Workspace]:
        return []


async def preview(settings: ProjectSettings) -> tuple[Plan, list[str]]:
    """What decide would do now, observing but never acting."""
    from ralph_dev.adapters.store import StateStore, utcnow
    from ralph_dev.adapters.tracker import open_tracker
    from ralph_dev.control.loop.observe import observe
    from ralph_dev.control.loop.wiring import jj_for, tmux_for
    from ralph_dev.core.decide import decide

    notes: list[str] = []
    repo = jj_for(settings)
    jj: WorkspaceLister = repo.workspaces
    try:
        repo.trunk.check_repo()
    except RalphError as exc:
        notes.append(f"jj not observed: {exc}")
        jj = _NoWorkspaces()
    tracker = open_tracker(settings)
    try:
        observed, _ = await observe(tracker, tmux_for(settings), jj, StateStore(settings.paths),
                                    agent_aware=aware_roles(settings))
    finally:
        await tracker.close()
    if not observed.tracker_ok:
        notes.append("the tracker could not be read: dispatch would be skipped this tick")
    return decide(observed, settings, utcnow()), notes


@main.command()
@project_argument
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def plan(cli: CliContext, project: str, as_json: bool) -> None:
    """Print the actions the controller would take now, without taking them, and what
    each issue it leaves alone waits on (as `status` says it)."""
    from ralph_dev.control.state.text import wait_text

    settings = cli.project_or_last_good(project)
    result, notes = run(preview(settings))
    waits = {ident: wait.as_json() for ident, wait in sorted(result.waits.items())}
    if as_json:
        echo_json({"project": project, "actions": [action_json(a) for a in result.actions],
                   "waits": [{"issue": ident, **wait} for ident, wait in waits.items()],
                   "notes": notes})
        return
    for note in notes:
        click.echo(f"note: {terminal_line(note)}", err=True)
    if not result.actions and not waits:
        click.echo("Nothing to do: everything is as wanted.")
        return
    for action in result.actions:
        extra = f" [{action.role.value}]" if isinstance(action, Spawn | Restart) else ""
        click.echo(f"{action.kind:<9} {action.issue:<10}{extra} {terminal_line(action.reason)}")
    if not result.actions:
        click.echo("Nothing to do now.")
    for ident, wait in waits.items():
        click.echo(f"{'wait':<9} {ident:<10} [{wait['kind']}] "
                   f"{terminal_line(wait_text(wait))}")


@main.command()
@click.option("--keep", is_flag=True, help="Keep the throwaway directory afterwards.")
@click.option("--timeout", default=900.0, show_default=True,
              help="Give up after this many seconds.")
@click.option("--claude/--scripted", "use_claude", default=None,
              help="Force real Claude Code sessions or the scripted agent (default: Claude "
                   "Code when its CLI is found).")
@click.option("--agent", "agent", type=click.Choice(SUPPORTED), default="claude",
              show_default=True,
              help="The agent CLI the workers run, against a scripted fake of its provider's "
                   "API on loopback (scripts/setup.sh installs each).")
@click.option("--review-agent", "review_agent", type=click.Choice(SUPPORTED),
              default=None,
              help="Review each change before its merge, the review workers on this agent "
                   "CLI (beside the others on --agent's).")
@click.option("--workers", default=3, show_default=True, type=click.IntRange(1, 8))
@click.option("--cluster", "nodes", default=0, type=click.IntRange(0, 4), metavar="N",
              help="Place the workers on a Ray cluster of N nodes on this machine (needs "
                   "Ray: pip install 'ralph-dev[ray]').")
def demo(keep: bool, timeout: float, use_claude: bool | None, agent: str,
         review_agent: str | None, workers: int, nodes: int) -> None:
    """DEMO: run a swarm on a throwaway project with a local tracker, start to finish."""
    from ralph_dev.devtools.demo import run_demo

    code = run_demo(keep=keep, timeout=timeout, use_claude=use_claude, echo=click.echo,
                    workers=workers, cluster=nodes, agent=agent, review_agent=review_agent)
    if code:
        raise SystemExit(code)
