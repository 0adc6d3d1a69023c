"""``ralph-dev init`` writing a project's table into the person's config.toml.

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

from ralph_dev.adapters.files import atomic_write_text
from ralph_dev.core.config import (
    ProjectSettings,
    project_from_table,
    project_names,
    read_config_file,
)
from ralph_dev.core.errors import ConfigError
from ralph_dev.core.paths import ProjectPaths, config_file


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
"""In the project's state dir: its table as the controller last read it valid. While a
person's edit leaves the file invalid, the swarm runs on it, and ``status`` shows it."""


def remember_good(name: str, config_path: Path) -> None:
    """Keep the project's table as the config file holds it now (it was just read valid)."""
    table = read_config_file(config_path).get("projects", {}).get(name)
    if isinstance(table, dict):
        atomic_write_text(ProjectPaths(name).state_dir / LAST_GOOD,
                          json.dumps(table, default=str) + "\n")


def last_good(name: str, config_path: Path) -> ProjectSettings | None:
    """The settings the swarm runs on while the config file is invalid (None: never read
    valid by a controller)."""
    try:
        table = json.loads((ProjectPaths(name).state_dir / LAST_GOOD).read_text("utf-8"))
        return project_from_table(name, table, config_path)
    except (OSError, ValueError, ConfigError):
        return None
