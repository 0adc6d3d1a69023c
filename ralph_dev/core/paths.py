"""Where ralph-dev keeps things: the XDG directories and one project's files in them.

Resolved from the environment each time, so setting ``XDG_CONFIG_HOME``,
``XDG_STATE_HOME`` and ``XDG_DATA_HOME`` isolates a whole instance (the tests,
the demo and the benchmarks run that way: :func:`sandbox_env`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ralph_dev.core.errors import ConfigError

PROJECT_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,39}")


def _xdg(var: str, fallback: str) -> Path:
    value = os.environ.get(var)
    if value and Path(value).is_absolute():
        return Path(value)
    return Path.home() / fallback


def config_home() -> Path:
    return _xdg("XDG_CONFIG_HOME", ".config") / "ralph-dev"


def state_home() -> Path:
    return _xdg("XDG_STATE_HOME", ".local/state") / "ralph-dev"


def data_home() -> Path:
    return _xdg("XDG_DATA_HOME", ".local/share") / "ralph-dev"


def config_file() -> Path:
    override = os.environ.get("RALPH_DEV_CONFIG")
    return Path(override) if override else config_home() / "config.toml"


def sandbox_env(root: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with every XDG dir inside ``root`` and no ralph-dev/tmux settings
    inherited: a whole private ralph-dev instance (the demo, tests, benchmarks)."""
    env = {k: v for k, v in environ.items()
           if not k.startswith(("RALPH_DEV_", "XDG_", "TMUX"))}
    for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_STATE_HOME", "state"),
                     ("XDG_DATA_HOME", "data"), ("XDG_CACHE_HOME", "cache")):
        (root / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(root / sub)
    return env


def check_project_name(name: str) -> str:
    if not isinstance(name, str) or not PROJECT_NAME_RE.fullmatch(name):
        raise ConfigError(
            f"{name!r} is not a valid project name: use 1-40 letters, digits, '-' or '_', "
            "starting with a letter or digit"
        )
    return name


@dataclass(frozen=True)
class ProjectPaths:
    """Where one project's files live; derived, never configured piecemeal."""

    project: str

    def private_roots(self) -> tuple[Path, ...]:
        """ralph-dev's state and data roots and this project's dirs: owner only (0700)."""
        return (state_home(), data_home(), self.state_dir, self.data_dir)

    @property
    def state_dir(self) -> Path:
        return state_home() / self.project

    @property
    def data_dir(self) -> Path:
        return data_home() / self.project

    @property
    def tracker_db(self) -> Path:
        return self.data_dir / "tracker.db"

    @property
    def records_dir(self) -> Path:
        return self.state_dir / "state"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def events_file(self) -> Path:
        return self.state_dir / "events.jsonl"

    @property
    def heartbeat_file(self) -> Path:
        return self.state_dir / "heartbeat.json"

    @property
    def trunk_red_file(self) -> Path:
        """Present while trunk's verify fails: merges wait until it passes again."""
        return self.state_dir / "trunk-red.json"

    @property
    def lane_dir(self) -> Path:
        """The merge lane's verify runs (``control.loop.merging``): the current run, each
        run's process files, and trunk's verify owed after merges."""
        return self.state_dir / "lane"

    @property
    def pauses_file(self) -> Path:
        """Swarm-wide pauses in force (``core.model.Pause``), one per kind."""
        return self.state_dir / "pauses.json"

    @property
    def controller_lock(self) -> Path:
        return self.state_dir / "controller.lock"

    @property
    def daemon_pid(self) -> Path:
        return self.state_dir / "daemon.pid"

    @property
    def prompts_dir(self) -> Path:
        return self.state_dir / "prompts"

    @property
    def workers_dir(self) -> Path:
        """One directory per worker (``WORKER/run``, ``home``, ``tmp``): all its sandbox
        may see of ralph-dev (``adapters.mailbox``)."""
        return self.state_dir / "workers"

    def worker_dir(self, issue: str) -> Path:
        from ralph_dev.core.model import check_identifier

        return self.workers_dir / check_identifier(issue)

    @property
    def relay_dir(self) -> Path:
        """Accepted worker reports whose tracker writes are still to be made (retried
        through outages; each file goes when its writes are done)."""
        return self.state_dir / "relay"

    @property
    def agent_home(self) -> Path:
        """HOME given to agent processes (pre-seeded so no first-run screen blocks)."""
        return self.data_dir / "agent-home"

    @property
    def default_workspace_root(self) -> Path:
        return self.data_dir / "workspaces"
