"""``ralph-dev init`` writing a project's table into the person's config.toml, and the
last good config a swarm ran with (what runs, and what is read, while the file is invalid).

tomlkit keeps the person's comments and layout elsewhere in the file; the
write is atomic and refuses to replace a table without ``--force``.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ralph_dev.adapters.files import atomic_write_text, private_dir
from ralph_dev.core.config import (
    ProjectSettings,
    project_from_table,
    project_names,
    read_project_table,
)
from ralph_dev.core.errors import ConfigError
from ralph_dev.core.paths import ProjectPaths, config_file, state_home


def project_table(settings: ProjectSettings) -> dict[str, Any]:
    """The TOML table ``init`` writes: only what differs from the defaults."""
    out: dict[str, Any] = {"repo": str(settings.repo), "trunk": settings.trunk}
    defaults = ProjectSettings(name=settings.name, repo=settings.repo)
    for f in dataclasses.fields(ProjectSettings):
        if f.name in ("name", "repo", "trunk"):
            continue
        value = getattr(settings, f.name)
        if value == getattr(defaults, f.name):
            continue
        if dataclasses.is_dataclass(value):
            # a table that is absent by default (cluster) is written whole: its presence
            # is the setting
            section_default = getattr(defaults, f.name)
            table = {
                sf.name: _toml_value(getattr(value, sf.name))
                for sf in dataclasses.fields(value)
                if getattr(value, sf.name) != getattr(section_default, sf.name, None)
            }
            if table or section_default is None:
                out[f.name] = table
        else:
            out[f.name] = _toml_value(value)
    return out


def _toml_value(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


def check_can_write(name: str, *, force: bool = False, path: Path | None = None) -> None:
    """Refuse to replace project ``name``'s table without ``force`` (init asks this
    before it touches the repository, and again when it writes)."""
    path = path or config_file()
    if not force and name in project_names(path):
        raise ConfigError(f"{path}: project {name!r} already exists; "
                          "use --force to replace its table")


def write_project(
    settings: ProjectSettings, *, force: bool = False, path: Path | None = None
) -> Path:
    """Add (or with ``force`` replace) one ``[projects.NAME]`` table, atomically.

    Uses tomlkit so a person's comments and layout elsewhere in the file survive.
    """
    import tomlkit

    path = path or config_file()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    try:
        tomllib.loads(text)
        doc = tomlkit.parse(text)
    except (tomllib.TOMLDecodeError, tomlkit.exceptions.TOMLKitError) as exc:
        raise ConfigError(f"{path}: not valid TOML, fix it before running init: {exc}") from exc
    check_can_write(settings.name, force=force, path=path)
    projects = doc.get("projects")
    if projects is None:
        projects = tomlkit.table(is_super_table=True)
        doc["projects"] = projects
    projects[settings.name] = project_table(settings)
    atomic_write_text(path, tomlkit.dumps(doc))
    return path


LAST_GOOD = "config.last-good.json"
"""In the project's state dir: its table as a swarm process (controller, daemon) last read
it valid, or as ``init`` wrote it. While a person's edit leaves the file invalid, the
swarm runs on it, and the commands that read (``status``, ``events``, ``logs``, ``issue
list``, ``plan``) use it."""

Signature = tuple[int, int, int]
"""The config file's inode, size and modification time: a change shows in it."""


def config_signature(path: Path) -> Signature | None:
    """The file's signature now (None: it cannot be seen). Taken before a read, it tells
    whether the file changed since what was read."""
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns)


def read_good(name: str, config_path: Path) -> ProjectSettings:
    """The project's settings from the file, which is read once; when they are valid, the
    very table read is kept as the last good config (never the file as it is a moment
    later: an edit landing between the read and the keeping must not become "good")."""
    table = read_project_table(name, config_path)
    settings = project_from_table(name, table, config_path)
    keep_good(name, table)
    return settings


def keep_good(name: str, table: Mapping[str, Any]) -> None:
    """Keep ``table``, the project's as it was just read (or written) valid, as its last
    good config."""
    paths = ProjectPaths(name)
    for directory in (state_home(), paths.state_dir):
        private_dir(directory)
    atomic_write_text(paths.state_dir / LAST_GOOD, json.dumps(table, default=str) + "\n")


def last_good(name: str, config_path: Path) -> ProjectSettings | None:
    """The settings the swarm runs on while the config file is invalid (None: never read
    valid by a swarm process)."""
    try:
        table = json.loads((ProjectPaths(name).state_dir / LAST_GOOD).read_text("utf-8"))
        return project_from_table(name, table, config_path)
    except (OSError, ValueError, ConfigError):
        return None


def projects_run() -> list[str]:
    """The projects with a last good config kept: what ran here, for the commands that
    read while the config file cannot be read at all."""
    root = state_home()
    try:
        return sorted(d.name for d in root.iterdir() if (d / LAST_GOOD).is_file())
    except OSError:
        return []


def settings_as_running(name: str, config_path: Path) -> tuple[ProjectSettings, str | None]:
    """The project's settings, and the config's problem when the file is invalid now (or
    lost the project's table): then the last good settings the swarm runs on (``status``
    and the fleet view still show it all)."""
    try:
        return project_from_table(name, read_project_table(name, config_path), config_path), None
    except ConfigError as exc:
        settings = last_good(name, config_path)
        if settings is None:
            raise
        return settings, str(exc)
