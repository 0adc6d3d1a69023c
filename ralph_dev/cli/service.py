"""`ralph-dev service install|uninstall PROJECT`: run the swarm as a systemd user service."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ralph_dev.cli import CliContext, main, pass_ctx
from ralph_dev.cli.swarm import every_project
from ralph_dev.core.errors import RalphError


@main.group()
def service() -> None:
    """Install ralph-dev as a systemd user service (one instance per project)."""


def service_path() -> str:
    """PATH for the service: jj's git first, this ralph-dev's bin, jj's and Claude Code's
    directories, then the PATH of the shell that installs it."""
    from ralph_dev.adapters.jj_cli import child_path, find_jj
    from ralph_dev.agent.claude import find_claude

    first = [str(Path(sys.executable).parent)]
    first += [str(Path(found).parent) for found in (find_jj(), find_claude()) if found]
    return child_path(base=os.pathsep.join([*first, os.environ.get("PATH", os.defpath)]))


@service.command("install")
@click.argument("project", required=False)
@click.option("--all", "everyone", is_flag=True,
              help="Every configured project (one instance of the unit each).")
@click.option("--no-enable", is_flag=True, help="Only write the unit file.")
@pass_ctx
def install_cmd(cli: CliContext, project: str | None, everyone: bool, no_enable: bool) -> None:
    """Write the unit and `systemctl --user enable --now ralph-dev@PROJECT` (or --all)."""
    every_project(cli, project, everyone, "install", "installed",
                  lambda name: _install(cli, name, no_enable))


def _install(cli: CliContext, project: str, no_enable: bool) -> None:
    from ralph_dev.adapters.processes import lock_holder
    from ralph_dev.adapters.systemd import check_env_files, env_files, install, unit_name

    settings = cli.project(project)  # refuse unknown projects before touching systemd
    running = lock_holder(settings.paths.daemon_pid)
    if running:
        raise RalphError(
            f"ralph-dev is already running for {project} (daemon pid {running}); a second one "
            f"under systemd would only fail: stop it with `ralph-dev stop {project}` (workers "
            "keep running and are adopted), then install again")
    keys = check_env_files(project)
    path = install(project, path_env=service_path(), enable=not no_enable)
    click.echo(f"Wrote {path}")
    click.echo("Keys from: " + (", ".join(map(str, keys)) if keys else
                                "nowhere yet; put KEY=value lines (ANTHROPIC_API_KEY=…) in "
                                + " or ".join(map(str, env_files(project))) + ", chmod 600"))
    if not no_enable:
        click.echo(f"Enabled and started {unit_name(project)}; logs: "
                   f"journalctl --user -u {unit_name(project)} -f")


@service.command("uninstall")
@click.argument("project", required=False)
@click.option("--all", "everyone", is_flag=True, help="Every configured project.")
@click.option("--no-disable", is_flag=True, help="Only remove the unit file.")
@pass_ctx
def uninstall_cmd(cli: CliContext, project: str | None, everyone: bool,
                  no_disable: bool) -> None:
    """Stop and disable ralph-dev@PROJECT (or --all); remove the unit when no project
    uses it."""
    from ralph_dev.adapters.systemd import uninstall
    from ralph_dev.core.config import project_names

    def one(name: str) -> None:
        uninstall(name, disable=not no_disable,
                  configured=name in project_names(cli.config_path))
        click.echo(f"Removed ralph-dev@{name}")

    every_project(cli, project, everyone, "uninstall", "uninstalled", one)
