"""`ralph-dev service install|uninstall PROJECT`: run the swarm as a systemd user service."""

from __future__ import annotations

import click

from ralph_dev.cli import CliContext, main, pass_ctx


@main.group()
def service() -> None:
    """Install ralph-dev as a systemd user service (one instance per project)."""


@service.command("install")
@click.argument("project")
@click.option("--no-enable", is_flag=True, help="Only write the unit file.")
@pass_ctx
def install_cmd(cli: CliContext, project: str, no_enable: bool) -> None:
    """Write the unit and `systemctl --user enable --now ralph-dev@PROJECT`."""
    from ralph_dev.adapters.systemd import install

    cli.project(project)  # refuse unknown projects before touching systemd
    path = install(project, enable=not no_enable)
    click.echo(f"Wrote {path}")
    if not no_enable:
        click.echo(f"Enabled and started ralph-dev@{project}; logs: "
                   f"journalctl --user -u ralph-dev@{project} -f")


@service.command("uninstall")
@click.argument("project")
@click.option("--no-disable", is_flag=True, help="Only remove the unit file.")
@pass_ctx
def uninstall_cmd(cli: CliContext, project: str, no_disable: bool) -> None:
    """Stop and disable ralph-dev@PROJECT; remove the unit when no project uses it."""
    from ralph_dev.adapters.systemd import uninstall

    uninstall(project, disable=not no_disable)
    click.echo(f"Removed ralph-dev@{project}")
