"""Every project's state document at once: what ``status`` with no project shows and
``/api/v1/fleet`` serves (behind the dashboard's one token)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ralph_dev.adapters.config_file import settings_as_running
from ralph_dev.control.state.status import SCHEMA_VERSION, snapshot
from ralph_dev.core.config import project_names
from ralph_dev.core.errors import ConfigError


async def fleet_document(config_path: Path, *, events: int,
                         own: tuple[str, Callable[[], Awaitable[dict[str, Any]]]] | None = None
                         ) -> dict[str, Any]:
    """``{"schema_version", "projects": [each project's state document], "errors"}``, in
    the order the config names them. ``own``: a project whose document its caller
    keeps (a daemon's own, cached), asked for that one instead. A project that cannot
    be read at all (no last good config either) is an error naming it, not a crash."""
    problem: str | None = None
    try:
        names = project_names(config_path)
    except ConfigError as exc:  # the file as a whole: each project's last good is not read
        names, problem = ([own[0]] if own else []), str(exc)
    docs, errors = [], {}
    for name in names:
        if own is not None and name == own[0]:
            docs.append(await own[1]())
            continue
        try:
            settings, error = settings_as_running(name, config_path)
        except ConfigError as exc:
            errors[name] = str(exc)
            continue
        docs.append(await snapshot(settings, events=events, config_error=error))
    fleet: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "projects": docs,
                             "errors": errors}
    if problem is not None:
        fleet["config_error"] = problem
    return fleet
