"""The ``ralph-dev`` command line: thin click commands over the library.

Each command group lives in its own module and registers itself on ``main``.
Domain errors (``RalphError``) become one clear line on stderr and a non-zero
exit code; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ralph_dev import __version__
from ralph_dev.core.config import ProjectSettings, load_project, project_names
from ralph_dev.core.errors import ConfigError, RalphError, UnknownProject
from ralph_dev.core.model import check_identifier
from ralph_dev.core.paths import check_project_name, config_file
from ralph_dev.core.text import for_terminal, terminal_line

if TYPE_CHECKING:
    from ralph_dev.adapters.config_file import Signature

T = TypeVar("T")

LAST_GOOD_USED = "its last good config (the one it ran with) is used"
"""What a command that reads (or stops) what runs does while the config file is invalid."""


@dataclass
class CliContext:
    """Injected into every command: where config lives and how to load a project."""

    config_path: Path
    _warned: set[str] = field(default_factory=set)

    def project(self, name: str, overrides: dict[str, Any] | None = None) -> ProjectSettings:
        return load_project(name, overrides, path=self.config_path)

    def project_as_running(self, name: str) -> tuple[ProjectSettings, str | None]:
        """The project's settings, and the config's problem when the file is invalid now
        (or lost the project's table): then the last good settings the swarm runs on
        (``status`` still shows it all)."""
        from ralph_dev.adapters.config_file import settings_as_running

        return settings_as_running(name, self.config_path)

    def project_or_last_good(self, name: str) -> ProjectSettings:
        """For a command that only reads (``status``, ``events``, ``logs``, ``issue list``,
        ``plan``) or stops what runs: the project's settings; while the config file is
        invalid, the last good ones the swarm runs on, with a warning on stderr (and with
        none kept, the file's error, as ever). A bad edit must not blind a person to what
        runs, nor keep them from stopping it."""
        settings, error = self.project_as_running(name)
        if error is not None:
            self.warn_invalid(name, error, LAST_GOOD_USED)
        return settings

    def warn_invalid(self, name: str, error: str, instead: str) -> None:
        """Say on stderr, once per project, that the config file is invalid, its problem,
        and what the command does ``instead``."""
        if name in self._warned:
            return
        self._warned.add(name)
        problem = error.removeprefix(f"{self.config_path}: ")
        click.echo(f"warning: the config file {self.config_path} is invalid: "
                   f"{terminal_line(problem)}\n  {name}: {instead} (until the file is "
                   "fixed)", err=True)

    def project_names_to_read(self) -> list[str]:
        """The configured projects; while the file cannot be read at all, the ones that
        ran here with a good config (their last good config is kept)."""
        try:
            return project_names(self.config_path)
        except ConfigError:
            from ralph_dev.adapters.config_file import projects_run

            names = projects_run()
            if not names:
                raise
            return names

    def project_to_run(self, name: str) -> tuple[ProjectSettings, str | None, Signature | None]:
        """What a controller starts with: the settings, the config's problem (None: the file
        is valid) and the file's signature taken before it was read (``ConfigWatch``).
        While the file is invalid, the last good config the swarm ran with runs (its
        daemon read the file valid before it started this controller: an edit landing in
        between must not stop the swarm), said as an event; with none kept, the controller
        waits for a fix (``project_when_valid``)."""
        from ralph_dev.adapters.config_file import config_signature, last_good, read_good
        from ralph_dev.adapters.store import StateStore

        seen = config_signature(self.config_path)
        try:
            return read_good(name, self.config_path), None, seen
        except ConfigError as exc:  # a table gone is an edit too, as for a running one
            settings = last_good(name, self.config_path)
            if settings is None:  # never ran: an unknown project is refused, as ever
                settings, seen = self.project_when_valid(name)
                return settings, None, seen
            StateStore(settings.paths).append_event(
                "config_invalid", file=str(self.config_path), error=str(exc),
                why="the controller starts on the last good config")
            return settings, str(exc), seen

    def project_when_valid(self, name: str, wait: float = 2.0
                           ) -> tuple[ProjectSettings, Signature | None]:
        """The project's settings; while the config is invalid, say so (the events, and a
        heartbeat ``status`` and the daemon read) and wait for a person's fix, instead of
        exiting into a crash loop. What the service's daemon starts with (and a
        controller, when no good config was ever read). With the file's signature taken
        before the good read (``ConfigWatch``)."""
        import time

        from ralph_dev.adapters.config_file import config_signature, read_good
        from ralph_dev.adapters.store import StateStore
        from ralph_dev.core.paths import ProjectPaths

        said = None
        while True:
            seen = config_signature(self.config_path)
            try:
                return read_good(name, self.config_path), seen
            except UnknownProject:
                raise
            except ConfigError as exc:
                store = StateStore(ProjectPaths(name))
                if str(exc) != said:
                    said = str(exc)
                    store.append_event("config_invalid", file=str(self.config_path),
                                       error=said, why="waiting for a fix to start")
                store.write_heartbeat(tick=0, config_error=said, acting="waiting for a "
                                                                         "valid config")
                time.sleep(wait)

    def project_for_issue(self, identifier: str, *, reading: bool = False) -> ProjectSettings:
        """The configured project whose issues carry ``identifier``'s key: the local
        tracker's key, or any team key of a Linear project (recorded at init and at
        each sync). ``reading``: for a command that only reads (``project_or_last_good``)."""
        check_identifier(identifier)
        key = identifier.rsplit("-", 1)[0]
        names = self.project_names_to_read() if reading else project_names(self.config_path)
        for name in names:
            settings, error = self.project_as_running(name) if reading \
                else (self.project(name), None)
            if key in issue_keys(settings):
                if error is not None:
                    self.warn_invalid(name, error, LAST_GOOD_USED)
                return settings
        raise ConfigError(
            f"no configured project uses the issue key {key!r} "
            f"(projects: {', '.join(names) or 'none'}); check the identifier or run ralph-dev init"
        )


def issue_keys(settings: ProjectSettings) -> frozenset[str]:
    if settings.tracker.kind != "linear":
        return frozenset({settings.key})
    from ralph_dev.adapters.tracker.linear.cache import team_keys

    return team_keys(settings) | ({settings.tracker.key} if settings.tracker.key else set())


pass_ctx = click.make_pass_decorator(CliContext)


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


class RalphGroup(click.Group):
    """Turns domain errors into ``click`` errors so users see a message, not a trace."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RalphError as exc:
            # errors quote tracker text (names, states, Linear's own messages)
            click.echo(f"Error: {for_terminal(str(exc))}", err=True)
            ctx.exit(exc.exit_code or 1)
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            ctx.exit(130)


@click.group(cls=RalphGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ralph-dev")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="RALPH_DEV_CONFIG",
    default=None,
    help="Config file (default: $XDG_CONFIG_HOME/ralph-dev/config.toml).",
)
@click.option(
    "--log-level",
    envvar="RALPH_DEV_LOG_LEVEL",
    default="WARNING",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Logging threshold for messages on stderr.",
)
@click.pass_context
def main(ctx: click.Context, config_path: Path | None, log_level: str) -> None:
    """Run a swarm of coding agents on a project, steered from an issue tracker."""
    from ralph_dev.adapters import logs

    logs.configure(log_level)
    if ctx.invoked_subcommand not in WORKERS_COMMANDS:
        from ralph_dev.inpane.worker import refuse_inside_a_worker

        refuse_inside_a_worker(str(ctx.invoked_subcommand))
    if config_path is not None and ctx.invoked_subcommand not in NO_CONFIG_READ \
            and not config_path.exists():
        given = ("--config" if ctx.get_parameter_source("config_path")
                 is click.core.ParameterSource.COMMANDLINE else "RALPH_DEV_CONFIG")
        raise ConfigError(
            f"the config file {config_path} ({given}) does not exist: check the path, or "
            f"create it with `ralph-dev --config {config_path} init PROJECT --repo PATH`")
    ctx.obj = CliContext(config_path=config_path or config_file())


WORKERS_COMMANDS = frozenset({"worker", "hook"})
"""The only commands a worker may run (its reports and Claude Code's hooks): inside a
worker's sandbox every other command, a person's, refuses."""

NO_CONFIG_READ = WORKERS_COMMANDS | {"init", "demo", None}
"""Commands that work without a config file: ``init`` writes it, the demo makes its own,
worker commands read none (and bare ``ralph-dev`` or ``--help`` runs no command)."""


def project_argument(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.argument("project", envvar="RALPH_DEV_PROJECT")(func)


def echo_json(data: Any) -> None:
    import json

    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


@main.command()
@click.argument("project")
@click.option("--repo", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The project's repository (a jj repo, colocated with git or not).")
@click.option("--tracker", "tracker_kind", type=click.Choice(["local", "linear"]),
              default="local", show_default=True)
@click.option("--key", help="Identifier prefix for the local tracker (default: from the name).")
@click.option("--linear-project", help="Linear project id, slug or name (with --tracker linear).")
@click.option("--linear-team", help="Key of the Linear team that gets new issues without a "
              "parent (tracker.linear_team), for a project of several teams; on a terminal "
              "init asks when it is missing.")
@click.option("--trunk", help="Trunk bookmark to merge into (default: the branch git's HEAD "
              "is on, else main or master).")
@click.option("--colocate", is_flag=True, help="Make a plain git repository a colocated jj "
              "repository (jj git init --colocate); git keeps working as before.")
@click.option("--workspace-root", type=click.Path(file_okay=False, path_type=Path),
              help="Where workers' jj workspaces go (default: under XDG_DATA_HOME).")
@click.option("--verify", "verify_command", help="Command that must pass before an issue is done.")
@click.option("--agent", "runner", type=click.Choice(["claude", "command"]), default=None)
@click.option("--agent-command", help="Template for --agent command ({issue} {role} "
              "{workspace} {prompt_file}).")
@click.option("--max-workers", type=click.IntRange(1, 64), default=None)
@click.option("--network", type=click.Choice(["allowlist", "none", "open"]),
              default="allowlist", show_default=True,
              help="What workers can reach (agent.network): their agent's API and "
                   "agent.allow_hosts through ralph-dev's egress proxy, nothing, or the "
                   "machine's whole network.")
@click.option("--force", is_flag=True, help="Replace an existing [projects.NAME] table.")
@pass_ctx
def init(
    cli: CliContext,
    project: str,
    repo: Path,
    tracker_kind: str,
    key: str | None,
    linear_project: str | None,
    linear_team: str | None,
    trunk: str | None,
    colocate: bool,
    workspace_root: Path | None,
    verify_command: str | None,
    runner: str | None,
    agent_command: str | None,
    max_workers: int | None,
    network: str,
    force: bool,
) -> None:
    """Add PROJECT to the config (refuses to replace one without --force)."""
    from ralph_dev.adapters.config_file import (
        check_can_write,
        keep_good,
        project_table,
        write_project,
    )
    from ralph_dev.control.checks.repo_setup import prepare_repo
    from ralph_dev.core.config import build_project

    check_project_name(project)
    repo = repo.expanduser().resolve()
    raw: dict[str, Any] = {"repo": str(repo), "trunk": trunk or "main"}
    tracker: dict[str, Any] = {"kind": tracker_kind}
    if key:
        tracker["key"] = key
    if linear_project:
        tracker["linear_project"] = linear_project
    if linear_team:
        tracker["linear_team"] = linear_team.strip().upper()
    raw["tracker"] = tracker
    if workspace_root:
        raw["workspace_root"] = str(workspace_root.expanduser().resolve())
    if verify_command:
        raw["verify_command"] = verify_command
    agent: dict[str, Any] = {}
    if runner:
        agent["runner"] = runner
    if agent_command:
        agent["command"] = agent_command
    agent["network"] = network
    raw["agent"] = agent
    if max_workers:
        raw["limits"] = {"max_workers": max_workers}
    settings = build_project(project, raw)  # every option checked before anything is touched
    check_can_write(project, force=force, path=cli.config_path)
    found = prepare_repo(repo, trunk=trunk, colocate=colocate)  # local, before Linear
    settings = build_project(project, {**raw, "trunk": found.trunk})
    linear = None
    if tracker_kind == "linear":
        from ralph_dev.cli.linear_setup import ask_team, prepare_linear

        linear = run(prepare_linear(settings, choose_team=ask_team if sys.stdin.isatty()
                                    else None))
        if linear.team and not settings.tracker.linear_team:  # chosen at the prompt
            tracker["linear_team"] = linear.team
            settings = build_project(project, {**raw, "trunk": found.trunk})
    for note in found.notes:
        click.echo(terminal_line(note))
    path = write_project(settings, force=force, path=cli.config_path)
    keep_good(project, project_table(settings))  # what commands that read fall back on
    if linear is not None:
        linear.record(settings)
    click.echo(f"Wrote [projects.{project}] to {path}")
    if tracker_kind == "local":
        click.echo(f"Local tracker key: {settings.key} (issues are {settings.key}-1, "
                   f"{settings.key}-2, …)")


def _register() -> None:
    """Attach the commands that live in their own modules (imported for their effect)."""
    from ralph_dev.cli import hook, issue, patterns, service, status, swarm, worker  # noqa: F401


_register()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
