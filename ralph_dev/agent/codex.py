"""Codex CLI as ralph-dev runs it: its program, its config home, its argv.

The one place that knows Codex's command line and files (``core.agent_profiles.CODEX``
says what it is; this does what it needs on disk):

* **Its own config home.** ``CODEX_HOME`` is the worker's own directory under its
  HOME (the sandbox's agent home), so nothing of a person's ``~/.codex`` (their
  login, their history, their MCP servers) reaches a worker, and a worker's
  sessions stay its own (``sessions/…/rollout-*.jsonl``: what a resume reads).
* **No question, ever.** ``codex exec`` runs one turn and exits; the seeded
  ``config.toml`` says never ask for an approval and run commands unconfined by
  Codex's own sandbox: the worker's bubblewrap confines it already (a Landlock
  sandbox inside it would only fail).
* **Only its own key.** The profile passes ``OPENAI_*`` (its key, its base URL)
  and nothing of another provider's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from ralph_dev.adapters.files import atomic_write_text, private_dir
from ralph_dev.agent.cli_bin import find_cli, resolve_cli_bin
from ralph_dev.core.agent_profiles import CODEX
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.model import Role

CONFIG = """\
# written by ralph-dev for one worker: Codex runs unattended inside ralph-dev's sandbox
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
allow_login_shell = false

[analytics]
enabled = false
"""

PROVIDER = """
# OPENAI_BASE_URL, which Codex itself does not read: its key stays in the environment
model_provider = "ralph-dev"

[model_providers.ralph-dev]
name = "OpenAI (OPENAI_BASE_URL)"
base_url = {base_url}
env_key = "OPENAI_API_KEY"
wire_api = "responses"
supports_websockets = false
"""
"""Codex 0.171 ignores ``OPENAI_BASE_URL`` and opens a WebSocket to its built-in
provider first; a provider of ralph-dev's own takes the variable's URL over plain
HTTP streaming (SSE)."""


def codex_config(env: Mapping[str, str]) -> str:
    """The worker's ``config.toml``: unattended, and pointed at ``OPENAI_BASE_URL``."""
    base_url = env.get(CODEX.base_url_variable)
    if not base_url:
        return CONFIG
    return CONFIG.replace("\n[analytics]", PROVIDER.format(base_url=json.dumps(base_url))
                          + "\n[analytics]", 1)


def codex_home(home: Path) -> Path:
    """The worker's ``CODEX_HOME``: its own, under the agent's HOME."""
    return home / CODEX.home_dir


def find_codex(path: str | None = None) -> str | None:
    """Codex as a person (or the demo) has it (``agent.cli_bin.find_cli``)."""
    return find_cli(CODEX, path)


def resolve_codex_bin(settings: ProjectSettings, path: str) -> str:
    """The Codex program workers run: ``agent.codex_bin``, or the set-up copy."""
    return resolve_cli_bin(CODEX, settings, path)


def prepare_codex(settings: ProjectSettings, env: dict[str, str], home: Path,
                  trust: Sequence[Path]) -> str:
    """Give the worker its own ``CODEX_HOME`` with ralph-dev's config; find the program."""
    del trust  # `codex exec` asks no trust question
    config_home = codex_home(home)
    private_dir(home)
    private_dir(config_home)
    atomic_write_text(config_home / "config.toml", codex_config(env), mode=0o600)
    env[CODEX.home_variable or "CODEX_HOME"] = str(config_home)
    return resolve_codex_bin(settings, env["PATH"])


def codex_argv(program: str, role: Role, model: str, *, extra_args: Sequence[str] = (),
               resume: str | None = None, workspace: Path | None = None) -> list[str]:
    """Codex's argv, without the prompt (the exec wrapper adds it as the last word)."""
    del role  # Codex has no per-tool allow-list; the sandbox is the fence
    return [
        program, *CODEX.start_words(resume),
        CODEX.model_flag, model,
        "--skip-git-repo-check",
        *(["--cd", str(workspace)] if workspace is not None and resume is None else []),
        *extra_args,
        "--",
    ]
