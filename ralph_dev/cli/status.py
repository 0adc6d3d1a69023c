"""People's commands: status, logs, attach, events, doctor."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import click

from ralph_dev.cli import CliContext, echo_json, main, pass_ctx, run
from ralph_dev.core.config import project_names
from ralph_dev.core.errors import ConfigError, RalphError
from ralph_dev.core.model import check_identifier


@main.command()
@click.argument("project", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--events", "n_events", default=10, show_default=True, help="Recent events shown.")
@pass_ctx
def status(cli: CliContext, project: str | None, as_json: bool, n_events: int) -> None:
    """Daemon, controller, workers, issue counts and recent events (all projects by default)."""
    from ralph_dev.control.status import render, snapshot

    names = [project] if project else project_names(cli.config_path)
    if not names:
        raise ConfigError("no projects configured yet: run `ralph-dev init PROJECT --repo PATH`")
    snaps = [run(snapshot(cli.project(name), events=n_events)) for name in names]
    if as_json:
        echo_json(snaps[0] if project else snaps)
        return
    click.echo("\n\n".join(render(s) for s in snaps))


@main.command()
@click.argument("issue")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output.")
@click.option("--project", help="Project (default: found from the issue key).")
@pass_ctx
def logs(cli: CliContext, issue: str, follow: bool, project: str | None) -> None:
    """Print a worker's terminal log, with escape sequences removed."""
    from ralph_dev.core.state import StateStore
    from ralph_dev.core.text import strip_ansi

    if issue == "controller":
        settings = cli.project(project or _only_project(cli))
    else:
        check_identifier(issue)
        settings = cli.project(project) if project else cli.project_for_issue(issue)
    store = StateStore(settings.paths)
    path = (settings.paths.logs_dir / "controller.log") if issue == "controller" \
        else store.log_path(issue)
    if not path.exists() and not follow:
        raise RalphError(f"no log for {issue} yet ({path})")
    position = 0
    while True:
        try:
            with path.open("rb") as handle:
                handle.seek(position)
                chunk = handle.read()
                position = handle.tell()
        except FileNotFoundError:
            chunk = b""
        if chunk:
            click.echo(strip_ansi(chunk.decode("utf-8", "replace")), nl=False)
        if not follow:
            return
        time.sleep(0.5)


@main.command()
@click.argument("issue", required=False)
@click.option("--project", help="Project (default: the only one, or from the issue key).")
@pass_ctx
def attach(cli: CliContext, issue: str | None, project: str | None) -> None:
    """Attach to the project's tmux session (at ISSUE's window if given)."""
    from ralph_dev.control.wiring import tmux_for

    if issue:
        check_identifier(issue)
        settings = cli.project(project) if project else cli.project_for_issue(issue)
    else:
        settings = cli.project(project or _only_project(cli))
    tmux_for(settings).attach(issue)


def _only_project(cli: CliContext) -> str:
    names = project_names(cli.config_path)
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
@pass_ctx
def events(cli: CliContext, project: str, issue: str | None, since: str | None,
           as_json: bool) -> None:
    """The project's event log: what ralph-dev did and why."""
    import json

    from ralph_dev.control.status import format_event
    from ralph_dev.core.state import StateStore, from_iso

    settings = cli.project(project)
    if issue:
        check_identifier(issue)
    cutoff = _parse_since(since) if since else None
    for event in StateStore(settings.paths).iter_events():
        if issue and event.get("issue") != issue:
            continue
        if cutoff:
            when = from_iso(event.get("time"))
            if when is None or when < cutoff:
                continue
        click.echo(json.dumps(event) if as_json else format_event(event))


@main.command()
@click.argument("project", required=False)
@pass_ctx
def doctor(cli: CliContext, project: str | None) -> None:
    """Check tmux, jj, git, claude, config and tracker access; say what to fix."""
    from ralph_dev.control.doctor import run_checks

    problems = 0
    for check in run(run_checks(cli.config_path, project, cli.project)):
        mark = "OK  " if check.ok else "FAIL"
        click.echo(f"[{mark}] {check.name}: {check.detail}")
        problems += not check.ok
    if problems:
        raise RalphError(f"{problems} check(s) failed; fix them as described above")
