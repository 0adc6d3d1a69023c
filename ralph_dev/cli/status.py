"""People's commands: status, logs, attach, events, doctor, notify-test."""

from __future__ import annotations

import asyncio
import contextlib
import select
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

import click

from ralph_dev.adapters.files import read_tail
from ralph_dev.adapters.store import StateStore
from ralph_dev.cli import LAST_GOOD_USED, CliContext, echo_json, main, pass_ctx, run
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import ConfigError, HostUnavailable, RalphError
from ralph_dev.core.model import check_identifier
from ralph_dev.core.ports import RemoteWorkers
from ralph_dev.core.text import for_terminal, terminal_line

LOG_REPLAY_BYTES = 4 * 2**20
"""How much of a log ``logs`` replays: the end of a long run, not all of it."""
FOLLOW_POLL = 0.5
"""Seconds between looks at a growing file with ``events -f`` and ``logs -f``."""
CLEAR_SCREEN = "\x1b[H\x1b[2J"
"""Cursor home, clear screen: each ``status --watch`` refresh replaces the last one."""


@main.command()
@click.argument("project", required=False)
@click.option("--json", "as_json", is_flag=True,
              help="The state document (schema_version 1); without PROJECT, "
                   '{"schema_version": 1, "projects": [...]}.')
@click.option("--events", "n_events", default=10, show_default=True,
              type=click.IntRange(0, 1000), help="Recent events shown (0-1000).")
@click.option("--watch", is_flag=True, help="Keep showing it, refreshed (Ctrl-C ends).")
@click.option("--interval", default=2.0, show_default=True, type=click.FloatRange(0.5, 3600),
              help="Seconds between refreshes with --watch.")
@pass_ctx
def status(cli: CliContext, project: str | None, as_json: bool, n_events: int, watch: bool,
           interval: float) -> None:
    """What needs you, then daemon, controller, trunk, issues, workers and recent events
    (all projects by default). Times are local, with the zone shown."""
    from ralph_dev.control.daemon.web.access import login_url
    from ralph_dev.control.state.sources import StateSources
    from ralph_dev.control.state.status import SCHEMA_VERSION, snapshot, tracker_ttl
    from ralph_dev.control.state.text import render_fleet

    if watch and as_json:
        raise click.UsageError("--watch redraws the terminal view; use --json without it")
    names = [project] if project else cli.project_names_to_read()
    if not names:
        raise ConfigError("no projects configured yet: run `ralph-dev init PROJECT --repo PATH`")
    loaded = [cli.project_as_running(name) for name in names]
    settings = [s for s, _ in loaded]
    errors = {s.name: error for s, error in loaded}
    for name, error in errors.items():
        if error is not None:  # the document says it too (NEEDS YOU)
            cli.warn_invalid(name, error, LAST_GOOD_USED)

    async def documents(sources: list[StateSources]) -> list[dict[str, Any]]:
        return [await snapshot(s.settings, events=n_events, sources=s,
                               config_error=errors[s.settings.name]) for s in sources]

    def shown(docs: list[dict[str, Any]]) -> str:
        return render_fleet(docs, [login_url(s.paths) for s in settings])

    async def once() -> list[dict[str, Any]]:
        sources = [StateSources(s) for s in settings]
        try:
            return await documents(sources)
        finally:
            for source in sources:
                await source.close()

    if not watch:
        docs = run(once())
        if as_json:
            echo_json(docs[0] if project else {"schema_version": SCHEMA_VERSION,
                                                "projects": docs})
        else:
            click.echo(shown(docs))
        return

    async def watch_loop() -> None:
        sources = [StateSources(s, issues_ttl=tracker_ttl(s)) for s in settings]
        try:
            while True:
                text = shown(await documents(sources))
                click.echo(CLEAR_SCREEN + text + f"\n\n(every {interval:g}s; Ctrl-C ends)")
                await asyncio.sleep(interval)
        finally:
            for source in sources:
                await source.close()

    with contextlib.suppress(KeyboardInterrupt):
        run(watch_loop())


@main.command()
@click.argument("issue")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output.")
@click.option("--project", help="Project (default: found from the issue key).")
@pass_ctx
def logs(cli: CliContext, issue: str, follow: bool, project: str | None) -> None:
    """Print a worker's pane as the terminal showed it (its log replayed through a
    terminal emulator: lines that scrolled by, then the last screen). --follow prints
    lines as they scroll; `ralph-dev attach` shows the live screen."""
    from ralph_dev.adapters.terminal import Replay

    if issue == "controller":
        settings = cli.project_or_last_good(project or _only_project(cli))
    else:
        check_identifier(issue)
        settings = cli.project_or_last_good(project) if project \
            else cli.project_for_issue(issue, reading=True)
    store = StateStore(settings.paths)
    path = (settings.paths.logs_dir / "controller.log") if issue == "controller" \
        else store.log_path(issue)
    cluster = _cluster_worker(settings, store, issue)

    def read(position: int) -> tuple[bytes, int]:
        if cluster is not None:  # its pane prints on its host: read through its actor
            with contextlib.suppress(HostUnavailable):  # ended: the copy kept here
                return cluster.read_log(issue, position, LOG_REPLAY_BYTES)
        return read_tail(path, position, LOG_REPLAY_BYTES)

    if cluster is None and not path.exists() and not follow:
        raise RalphError(f"no log for {issue} yet ({path})")
    replay = Replay()
    position = 0
    while True:
        chunk, position = read(position)
        for line in replay.feed(chunk):
            click.echo(for_terminal(line))
        if not follow:
            for line in replay.shown():
                click.echo(for_terminal(line))
            return
        time.sleep(FOLLOW_POLL)


def _cluster_worker(settings: ProjectSettings, store: StateStore, issue: str
                    ) -> RemoteWorkers | None:
    """The other hosts an issue's worker was placed on (None: it runs, or ran, here)."""
    if settings.cluster is None or issue == "controller":
        return None
    record = store.load_record(issue)
    if record is None or not record.node:
        return None
    from ralph_dev.control.loop.wiring import remote_workers_for

    return remote_workers_for(settings, store)


def _watch_screen(cluster: RemoteWorkers, issue: str, host: str, typed: TextIO | None = None
                  ) -> None:
    """A cluster worker's live screen, and each line typed sent into its session: its
    host's tmux is not this one's, so a person types a line at a time (sent on Enter,
    as literal text). The end of input leaves, as Ctrl-C does."""
    typed = sys.stdin if typed is None else typed
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            screen = cluster.screen(issue)
            click.clear()
            click.echo(f"{issue} on {host}: a line you type and Enter go to its agent; "
                       "Ctrl-C leaves")
            click.echo(for_terminal(screen))
            ready, _, _ = select.select([typed], [], [], 1.0)
            if not ready:
                continue
            line = typed.readline()
            if not line:
                return
            if line.strip():
                cluster.type_line(issue, line.rstrip("\n"))


@main.command()
@click.argument("issue", required=False)
@click.option("--project", help="Project (default: the only one, or from the issue key).")
@pass_ctx
def attach(cli: CliContext, issue: str | None, project: str | None) -> None:
    """Attach to the project's tmux session (at ISSUE's window if given)."""
    from ralph_dev.control.loop.wiring import tmux_for

    if issue:
        check_identifier(issue)
        settings = cli.project(project) if project else cli.project_for_issue(issue)
    else:
        settings = cli.project(project or _only_project(cli))
    store = StateStore(settings.paths)
    cluster = _cluster_worker(settings, store, issue) if issue else None
    if issue and cluster is not None:
        record = store.load_record(issue)
        _watch_screen(cluster, issue, record.host if record and record.host else "its host")
        return
    tmux = tmux_for(settings)
    if not tmux.session_exists():
        raise RalphError(f"ralph-dev is not running for {settings.name} (no tmux session "
                         f"{settings.session_name}): start it with `ralph-dev start "
                         f"{settings.name}`")
    if issue and not tmux.find(issue):
        raise RalphError(f"{issue} has no window in {settings.session_name}: no worker runs "
                         f"for it now (see `ralph-dev status {settings.name}`)")
    tmux.attach(issue)


def _only_project(cli: CliContext) -> str:
    names = cli.project_names_to_read()
    if len(names) != 1:
        known = ", ".join(names) or "none"
        raise ConfigError(f"name the project with --project (configured: {known})")
    return names[0]


def _parse_since(text: str) -> datetime:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text and text[-1] in units and text[:-1].isdigit():
        return datetime.now(UTC) - timedelta(seconds=int(text[:-1]) * units[text[-1]])
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: use a duration like 30m, 2h, 1d or an ISO time"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@main.command()
@click.argument("project")
@click.option("--issue", help="Only this issue's events.")
@click.option("--since", help="Only newer than a duration (30m, 2h, 1d) or an ISO time.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events (Ctrl-C ends).")
@pass_ctx
def events(cli: CliContext, project: str, issue: str | None, since: str | None,
           as_json: bool, follow: bool) -> None:
    """The project's event log: what ralph-dev did and why (times local, zone shown)."""
    import json

    from ralph_dev.adapters.store import from_iso
    from ralph_dev.control.state.text import format_event

    settings, store = _event_log(cli, project)
    if issue:
        check_identifier(issue)
        if settings is not None:
            _known_issue(settings, issue, store)
    cutoff = _parse_since(since) if since else None

    def wanted(event: dict[str, Any]) -> bool:
        if issue and event.get("issue") != issue:
            return False
        if cutoff:
            when = from_iso(event.get("time"))
            return when is not None and when >= cutoff
        return True

    offset = 0
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            found, after = store.read_events_from(offset)
            for event in filter(wanted, found):
                click.echo(json.dumps(event) if as_json else format_event(event))
            if after == offset:  # caught up
                if not follow:
                    return
                time.sleep(FOLLOW_POLL)
            offset = after


def _event_log(cli: CliContext, project: str) -> tuple[ProjectSettings | None, StateStore]:
    """The project's settings and its event log. While the config file is invalid: the
    last good settings; with none kept, the log alone, found in the project's state dir
    (reading it needs no config), and no settings."""
    from ralph_dev.core.errors import UnknownProject
    from ralph_dev.core.paths import ProjectPaths, check_project_name

    try:
        settings = cli.project_or_last_good(project)
    except UnknownProject:
        raise
    except ConfigError as exc:
        paths = ProjectPaths(check_project_name(project))
        if not paths.events_file.is_file():
            raise
        cli.warn_invalid(project, str(exc), f"no good config of it is known: its events are "
                                            f"read from {paths.state_dir}")
        return None, StateStore(paths)
    return settings, StateStore(settings.paths)


def _known_issue(settings: ProjectSettings, issue: str, store: StateStore) -> None:
    """``events --issue`` for an issue the tracker does not know and no event names is a
    typo, not an issue without events: say so rather than print nothing."""
    from ralph_dev.adapters.tracker import open_tracker
    from ralph_dev.core.errors import TrackerError, TrackerInputError, UnknownIssue

    async def ask() -> None:
        tracker = open_tracker(settings)
        try:
            await tracker.get(issue)
        finally:
            await tracker.close()

    try:
        run(ask())
        return
    except TrackerInputError as exc:
        why = str(exc)
    except TrackerError as exc:  # the tracker is down: the events alone decide
        why = f"the tracker could not be asked ({exc})"
    if any(event.get("issue") == issue for event in store.iter_events()):
        return  # the history of an issue that has gone from the tracker
    raise UnknownIssue(f"{why}; and no event of {settings.name} names {issue}: check the "
                       f"identifier (`ralph-dev issue list {settings.name}`)")


@main.command()
@click.argument("project", required=False)
@pass_ctx
def doctor(cli: CliContext, project: str | None) -> None:
    """Check tmux, jj, git, claude, config and tracker access; say what to fix."""
    from ralph_dev.control.checks.doctor import run_checks

    problems = 0
    for check in run(run_checks(cli.config_path, project, cli.project)):
        mark = "OK  " if check.ok else "FAIL"
        click.echo(f"[{mark}] {check.name}: {terminal_line(check.detail)}")
        problems += not check.ok
    if problems:
        raise RalphError(f"{problems} check(s) failed; fix them as described above")


@main.command("notify-test")
@click.argument("project")
@pass_ctx
def notify_test(cli: CliContext, project: str) -> None:
    """Send a test message through PROJECT's notify.urls and notify.command."""
    from ralph_dev.adapters.notify import Message, deliver

    settings = cli.project(project)
    notify = settings.notify
    if not (notify.urls or notify.command):
        raise ConfigError(f"project {project!r} has no [projects.{project}.notify] urls or "
                          "command: add one (see the README's Notifications section)")
    message = Message(
        title=f"ralph-dev {project}: test notification",
        body="If you read this, ralph-dev can tell you when the swarm needs you.",
        data={"project": project, "cause": "test"},
    )
    problems = deliver(message, notify.urls, notify.command)
    for problem in problems:
        click.echo(f"FAIL {terminal_line(problem)}", err=True)
    if problems:
        raise RalphError(f"{len(problems)} notification target(s) failed, as listed above")
    targets = len(notify.urls) + bool(notify.command)
    click.echo(f"sent to {targets} target(s)")
