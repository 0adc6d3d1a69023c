"""The systemd user unit: one template, one instance per project.

``install`` pins what systemd's user manager cannot know (it reads no shell
profile): the Python that runs ralph-dev, its config, the PATH the workers need
(Claude Code, jj and the git beside it) and where keys come from. It writes the
unit and enables it, or — when it cannot (no user manager, a start that fails) —
leaves everything as it was before.
"""

from __future__ import annotations

import os
import shlex
import stat
import sys
from importlib import resources
from pathlib import Path

from ralph_dev.adapters.files import atomic_write_text
from ralph_dev.adapters.process import CommandFailed, CommandResult, run_command
from ralph_dev.core.errors import ConfigError, RalphError
from ralph_dev.core.paths import config_file

UNIT_NAME = "ralph-dev@.service"
NO_USER_MANAGER = (
    "is a systemd user manager running for you? In a desktop session it is; on a server "
    "run `loginctl enable-linger $USER` and log in again (then `systemctl --user status` "
    "answers)"
)


def unit_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def unit_name(project: str) -> str:
    return f"ralph-dev@{project}.service"


def _wants_link(project: str) -> Path:
    """The symlink ``systemctl --user enable`` makes: the instance is installed."""
    return unit_dir() / "default.target.wants" / unit_name(project)


def installed_projects() -> list[str]:
    wants = unit_dir() / "default.target.wants"
    return sorted(p.name[len("ralph-dev@"):-len(".service")]
                  for p in wants.glob("ralph-dev@*.service"))


def template_text() -> str:
    """The unit template (the repo's top-level systemd/ links to this package data)."""
    return resources.files("ralph_dev").joinpath("systemd", UNIT_NAME).read_text()


def env_files(project: str = "%i") -> list[Path]:
    """Where the service reads ``KEY=value`` lines (API keys) from, shared then the
    project's own: next to the config file."""
    directory = config_file().parent
    return [directory / "service.env", directory / f"{project}.env"]


def _unit_value(text: str) -> str:
    """``text`` as one word of a unit file line (specifiers escaped, quoted if needed)."""
    text = text.replace("%", "%%")
    if any(c in text for c in ' "\\\'\t'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def render_unit(path_env: str) -> str:
    """The template with this installation's interpreter, config, ``PATH`` (``path_env``)
    and key files."""
    exec_start = " ".join(
        [_unit_value(sys.executable), "-P", "-m", "ralph_dev", "--config",
         _unit_value(str(config_file())), "start", "%i", "--foreground"]
    )
    shared = env_files()[0]
    pinned = {
        "ExecStart=": f"ExecStart={exec_start}",
        "Environment=PATH=": "Environment=" + _unit_value(f"PATH={path_env}"),
        "EnvironmentFile=-%h/.config/ralph-dev/service.env":
            f"EnvironmentFile=-{_unit_value(str(shared))}",
        "EnvironmentFile=-%h/.config/ralph-dev/%i.env":
            f"EnvironmentFile=-{_unit_value(str(shared.parent))}/%i.env",
    }
    lines = []
    for line in template_text().splitlines():
        for prefix, replacement in pinned.items():
            if line.startswith(prefix):
                line = replacement
        lines.append(line)
    return "\n".join(lines) + "\n"


def check_env_files(project: str) -> list[Path]:
    """The key files the service will read; refuses one others can read (chmod 600)."""
    found = [p for p in env_files(project) if p.exists()]
    for path in found:
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            raise ConfigError(f"{path} holds keys for the service but others can read it: "
                              f"run `chmod 600 {shlex.quote(str(path))}` and install again")
    return found


def _systemctl(*args: str) -> CommandResult:
    """``systemctl --user ARGS``: the one place ralph-dev runs systemctl."""
    return run_command(["systemctl", "--user", *args], timeout=60)


def _systemctl_checked(*args: str) -> None:
    _systemctl(*args).check(NO_USER_MANAGER)


def stop_unit_if_active(project: str) -> bool:
    """``systemctl --user stop`` the project's unit when it runs; False when there is
    no systemd user manager or the unit is not active."""
    if not _systemctl("is-active", "--quiet", unit_name(project)).ok:
        return False
    _systemctl_checked("stop", unit_name(project))
    return True


def install(project: str, *, path_env: str, enable: bool = True) -> Path:
    """Write the unit and (with ``enable``) enable and start the project's instance.

    When that fails, the unit file is put back as it was (removed if it was not
    there) and the instance is not left enabled; the error says why.
    """
    path = unit_dir() / UNIT_NAME
    previous = path.read_text() if path.exists() else None
    atomic_write_text(path, render_unit(path_env))
    if not enable:
        return path
    try:
        _systemctl_checked("daemon-reload")
        _systemctl_checked("enable", "--now", unit_name(project))
    except CommandFailed as exc:
        _systemctl("disable", "--now", unit_name(project))
        _wants_link(project).unlink(missing_ok=True)
        if previous is None:
            path.unlink(missing_ok=True)
        else:
            atomic_write_text(path, previous)
        _systemctl("daemon-reload")
        raise RalphError(f"could not enable {unit_name(project)}, so nothing was installed: "
                         f"{exc} (its log: journalctl --user -u {unit_name(project)})") from exc
    return path


def uninstall(project: str, *, disable: bool = True, configured: bool = False) -> Path:
    """Stop and disable the instance; remove the template once no instance uses it.

    Refuses (non-zero) a project that has no unit installed and is not configured:
    a typo must not read as success. A configured one whose template an earlier
    uninstall removed (``--all``) has nothing left to remove.
    """
    path = unit_dir() / UNIT_NAME
    if not _wants_link(project).exists() and not configured:
        others = ", ".join(installed_projects()) or "none"
        raise RalphError(f"no {unit_name(project)} is installed (installed: {others}); "
                         "check the project name")
    if disable:
        _systemctl_checked("disable", "--now", unit_name(project))
    _wants_link(project).unlink(missing_ok=True)
    if not installed_projects():
        path.unlink(missing_ok=True)
    if disable:
        _systemctl_checked("daemon-reload")
    return path
