"""The Linear API key: where it comes from, and never where it can be seen."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ralph_dev.core.errors import (
    ConfigError,
)

if TYPE_CHECKING:
    from ralph_dev.core.config import TrackerSettings


KEY_ENV = "LINEAR_API_KEY"


@dataclass(frozen=True)
class ApiKey:
    """A Linear API key and where it came from; ``repr`` never shows the key."""

    value: str = field(repr=False)
    source: str

    def __str__(self) -> str:
        return f"the Linear API key from {self.source}"


def load_api_key(tracker: TrackerSettings, env: Mapping[str, str] | None = None) -> ApiKey:
    """``LINEAR_API_KEY``, else ``tracker.linear_api_key_file`` (owner-only permissions)."""
    environ = os.environ if env is None else env
    value = (environ.get(KEY_ENV) or "").strip()
    if value:
        return ApiKey(value, f"the {KEY_ENV} environment variable")
    path = tracker.linear_api_key_file
    if path is None:
        raise ConfigError(
            f"no Linear API key: set {KEY_ENV}, or tracker.linear_api_key_file = "
            "'/path/to/key' in the project's config (a file only you can read)"
        )
    path = Path(path).expanduser()
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(
            f"Linear API key file {path}: {exc.strerror}; create it or fix "
            "tracker.linear_api_key_file"
        ) from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"Linear API key file {path} can be read by other users; run: chmod 600 {path}"
        )
    try:
        value = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read Linear API key file {path}: {exc.strerror}") from exc
    if not value:
        raise ConfigError(f"Linear API key file {path} is empty; put the key in it")
    return ApiKey(value, f"the file {path}")
