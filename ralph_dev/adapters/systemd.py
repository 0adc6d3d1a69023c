"""The systemd user unit: one template, one instance per project."""

from __future__ import annotations

import shlex
import sys
from importlib import resources
from pathlib import Path

from ralph_dev.adapters.process import CommandResult, run_command
from ralph_dev.core.fsutil import atomic_write_text
from ralph_dev.core.paths import config_file

UNIT_NAME = "ralph-dev@.service"


def unit_dir() -> Path:
    import os

    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def template_text() -> str:
    """The unit template (the repo's top-level systemd/ links to this package data)."""
    return resources.files("ralph_dev").joinpath("systemd", UNIT_NAME).read_text()


def render_unit() -> str:
    """The template with this installation's interpreter and config pinned.

    systemd's user manager does not see a shell's PATH or virtualenv, so the
    unit names the exact Python that runs ralph-dev and the config it reads.
    """
    exec_start = " ".join(
        [shlex.quote(sys.executable), "-m", "ralph_dev", "--config",
         shlex.quote(str(config_file())), "start", "%i", "--foreground"]
    )
    lines = []
    for line in template_text().splitlines():
        if line.startswith("ExecStart="):
            line = f"ExecStart={exec_start}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _systemctl(*args: str) -> CommandResult:
    """``systemctl --user ARGS``: the one place ralph-dev runs systemctl."""
    return run_command(["systemctl", "--user", *args], timeout=30)


def _systemctl_checked(*args: str) -> None:
    _systemctl(*args).check("is a systemd user session running (loginctl enable-linger $USER)?")


def stop_unit_if_active(project: str) -> bool:
    """``systemctl --user stop`` the project's unit when it runs; False when there is
    no systemd user manager or the unit is not active."""
    unit = f"ralph-dev@{project}.service"
    if not _systemctl("is-active", "--quiet", unit).ok:
        return False
    _systemctl_checked("stop", unit)
    return True


def install(project: str, *, enable: bool = True) -> Path:
    path = unit_dir() / UNIT_NAME
    atomic_write_text(path, render_unit())
    if enable:
        _systemctl_checked("daemon-reload")
        _systemctl_checked("enable", "--now", f"ralph-dev@{project}.service")
    return path


def uninstall(project: str, *, disable: bool = True) -> Path:
    path = unit_dir() / UNIT_NAME
    if disable:
        _systemctl_checked("disable", "--now", f"ralph-dev@{project}.service")
    others = [p for p in (unit_dir() / "default.target.wants").glob("ralph-dev@*.service")
              if p.name != f"ralph-dev@{project}.service"]
    if not others:
        path.unlink(missing_ok=True)
    if disable:
        _systemctl_checked("daemon-reload")
    return path
