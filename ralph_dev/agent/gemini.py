"""Gemini CLI as ralph-dev runs it: its program, its config home, its argv.

The one place that knows Gemini CLI's command line and files (``core.agent_profiles.GEMINI``
says what it is; this does what it needs on disk):

* **Its own config home.** ``GEMINI_CLI_HOME`` is the worker's agent HOME, so its
  ``.gemini`` (settings, sessions under ``tmp/<project>/chats``) is the worker's own:
  nothing of a person's ``~/.gemini`` (their login, their MCP servers, their history)
  reaches a worker.
* **No question, ever.** It runs headless (no terminal, its prompt on stdin, one turn)
  with ``--approval-mode yolo``; the seeded settings turn its folder-trust check off
  (an untrusted folder would quietly drop it back to asking for each tool) and its
  own sandbox too: the worker's bubblewrap confines it already.
* **Only its own key.** The profile passes ``GEMINI_*`` and ``GOOGLE_GEMINI_*`` (its key,
  its base URL) and nothing of another provider's; the settings pick the API-key login,
  which also holds when ``GOOGLE_GEMINI_BASE_URL`` points it elsewhere (without them it
  takes that for a gateway login its headless mode refuses).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ralph_dev.adapters.files import atomic_write_text, private_dir
from ralph_dev.agent.cli_bin import find_cli, resolve_cli_bin
from ralph_dev.core.agent_profiles import GEMINI
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.model import Role

SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
    "tools": {"sandbox": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
}
"""The worker's ``settings.json``: unattended, its key, nothing sent home."""


def gemini_dir(home: Path) -> Path:
    """The worker's ``.gemini``: its own, under the agent's HOME."""
    return home / GEMINI.home_dir


def find_gemini(path: str | None = None) -> str | None:
    """Gemini CLI as a person (or the demo) has it (``agent.cli_bin.find_cli``)."""
    return find_cli(GEMINI, path)


def resolve_gemini_bin(settings: ProjectSettings, path: str) -> str:
    """The Gemini CLI program workers run: ``agent.gemini_bin``, or the set-up copy."""
    return resolve_cli_bin(GEMINI, settings, path)


def prepare_gemini(settings: ProjectSettings, env: dict[str, str], home: Path,
                   trust: Sequence[Path]) -> str:
    """Give the worker its own ``.gemini`` with ralph-dev's settings; find the program."""
    del trust  # its folder-trust check is off: the sandbox is the fence
    config = gemini_dir(home)
    private_dir(home)
    private_dir(config)
    atomic_write_text(config / "settings.json", json.dumps(SETTINGS, indent=2) + "\n",
                      mode=0o600)
    env[GEMINI.home_variable or "GEMINI_CLI_HOME"] = str(home)
    return resolve_gemini_bin(settings, env["PATH"])


def gemini_argv(program: str, role: Role, model: str, *, extra_args: Sequence[str] = (),
                resume: str | None = None) -> list[str]:
    """Gemini CLI's argv, ending ``--``: the launcher appends the prompt, which its
    supervisor (``inpane.gemini_exec``) takes off and writes to the CLI's stdin."""
    del role  # no per-tool allow-list here: the sandbox is the fence
    return [program, *GEMINI.start_words(resume), GEMINI.model_flag, model, *extra_args, "--"]
