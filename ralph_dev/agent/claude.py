"""Claude Code as ralph-dev runs it: the binary, its plugin, its argv, its HOME.

The one place that knows Claude Code's command line and config files:

* **The plugin.** Skills and hooks come from ralph-dev's Claude Code plugin,
  shipped inside the package (``ralph_dev/plugin``: ``.claude-plugin/plugin.json``,
  ``skills/``, ``hooks/hooks.json``) so an installed wheel finds it; the
  repository's top-level ``skills/``, ``hooks/`` and ``.claude-plugin/`` link to
  it. It is loaded for the worker's session only, with ``--plugin-dir``.
* **No keypress, ever.** Claude Code's first-run and trust screens would wait
  for a person. ralph-dev marks the workspace root trusted in the agent's
  ``.claude.json`` (a trusted parent covers every workspace under it, checked
  with the real CLI), and an ``isolated`` agent HOME is also marked onboarded.
  The API key in the environment is pre-approved (unless a person rejected it
  in their own HOME). Permissions use ``--permission-mode dontAsk`` with an
  allow-list, so a tool outside the role's fence is denied, never asked about.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ralph_dev.adapters.files import atomic_write_text, flocked
from ralph_dev.adapters.process import CommandResult, run_command
from ralph_dev.agent.fence import tool_fence
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import RalphError
from ralph_dev.core.model import Role
from ralph_dev.core.paths import data_home


class AgentError(RalphError):
    """The agent cannot be started as configured; the message says how to fix it."""


PLUGIN_NAME = "ralph-dev"


def plugin_dir() -> Path:
    """ralph-dev's Claude Code plugin, inside the installed package."""
    here = Path(__file__).resolve().parent.parent / "plugin"
    if not (here / ".claude-plugin" / "plugin.json").is_file():
        raise AgentError(
            f"ralph-dev's Claude Code plugin is missing from {here} "
            "(.claude-plugin/plugin.json not found); reinstall ralph-dev"
        )
    return here


def skill_name(role: Role | str) -> str:
    """The name Claude Code offers the role's skill under (``PLUGIN:SKILL``)."""
    value = role.value if isinstance(role, Role) else str(role)
    return f"{PLUGIN_NAME}:ralph-dev-{value}"


def claude_config_file(env: Mapping[str, str]) -> Path:
    """Where the worker's claude keeps onboarding and trust (``.claude.json``)."""
    if env.get("CLAUDE_CONFIG_DIR"):
        return Path(env["CLAUDE_CONFIG_DIR"]) / ".claude.json"
    return Path(env["HOME"]) / ".claude.json"


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    lock = data_home() / "locks" / name
    lock.parent.mkdir(parents=True, exist_ok=True)
    with flocked(lock):
        yield


def _approve_key(data: dict[str, Any], api_key: str, *, isolated: bool) -> None:
    """Answer Claude Code's "use this API key?" question before it is asked.

    The key was handed to ralph-dev's environment on purpose, so it is
    approved; but a key a person explicitly rejected in their own HOME stays
    rejected (their claude then uses its login instead).
    """
    responses = data.setdefault("customApiKeyResponses", {})
    if not isinstance(responses, dict):
        responses = data["customApiKeyResponses"] = {}
    approved = responses.setdefault("approved", [])
    rejected = responses.setdefault("rejected", [])
    tail = api_key[-20:]  # Claude Code records the key's last 20 characters
    if tail in rejected:
        if not isolated:
            return
        rejected.remove(tail)
    if tail not in approved:
        approved.append(tail)


def seed_claude_config(
    path: Path, *, trust: Sequence[Path], isolated: bool, api_key: str | None = None
) -> bool:
    """Make ``path`` say: these directories are trusted, this API key is approved
    (and, for an isolated HOME, onboarding is done). Returns True when it wrote.

    Idempotent and atomic; a person's own file is only ever added to, and a
    broken one is reported rather than replaced.
    """
    with _locked("claude-json.lock"):
        try:
            data: Any = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            data = {}
        except (OSError, ValueError) as exc:
            if not isolated:
                raise AgentError(
                    f"{path} is not readable JSON ({exc}); Claude Code keeps its settings "
                    "there: fix the file (or move it away and run claude once), then retry"
                ) from exc
            data = {}
        if not isinstance(data, dict):
            data = {}
        before = json.dumps(data, sort_keys=True)
        projects = data.setdefault("projects", {})
        if not isinstance(projects, dict):
            projects = data["projects"] = {}
        for directory in trust:
            entry = projects.setdefault(str(directory), {})
            if isinstance(entry, dict):
                entry["hasTrustDialogAccepted"] = True
        if isolated:
            data["hasCompletedOnboarding"] = True
            data.setdefault("theme", "dark")
        if api_key:
            _approve_key(data, api_key, isolated=isolated)
        if json.dumps(data, sort_keys=True) == before:
            return False
        atomic_write_text(path, json.dumps(data, indent=2) + "\n", mode=0o600)
        return True


DEFAULT_CLAUDE_BIN = "claude"


def setup_dirs(cli: str = "claude") -> list[Path]:
    """Where ``scripts/setup.sh`` installs an agent CLI (``claude-code-VERSION``,
    ``codex-VERSION``), newest version first."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ralph-dev"

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", path.name))

    prefix = "claude-code" if cli == "claude" else cli
    return sorted(cache.glob(f"{prefix}-[0-9]*"), key=version, reverse=True)


def find_claude(path: str | None = None) -> str | None:
    """Claude Code as a person (or the demo) has it: ``$RALPH_DEV_CLAUDE_BIN``, ``claude``
    on ``path`` (None: this process's PATH), else the copy ``scripts/setup.sh``
    installed under ``~/.cache/ralph-dev/claude-code-VERSION``."""
    for candidate in (os.environ.get("RALPH_DEV_CLAUDE_BIN"), shutil.which("claude", path=path),
                      *(str(d / "node_modules/.bin/claude") for d in setup_dirs())):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def resolve_claude_bin(settings: ProjectSettings, path: str) -> str:
    """The Claude Code binary workers run: ``agent.claude_bin`` as configured (a path, or
    a name looked up on the workers' ``path``); left at its default, also the copy
    ``scripts/setup.sh`` installed."""
    configured = settings.agent.claude_bin
    if os.sep in configured:
        if Path(configured).is_file() and os.access(configured, os.X_OK):
            return configured
        raise AgentError(
            f"agent.claude_bin {configured!r} is not an executable file; install Claude Code "
            "(npm install -g @anthropic-ai/claude-code) or fix agent.claude_bin"
        )
    found = (find_claude(path) if configured == DEFAULT_CLAUDE_BIN
             else shutil.which(configured, path=path))
    if not found:
        raise AgentError(
            f"Claude Code ({configured!r}) is not on the worker's PATH nor installed by "
            "scripts/setup.sh; install it (scripts/setup.sh, or npm install -g "
            "@anthropic-ai/claude-code) or set agent.claude_bin to its full path"
        )
    return found


STATUS_LINE_SETTINGS = json.dumps({"statusLine": {
    "type": "command", "command": "ralph-dev hook status-line"}}, separators=(",", ":"))
"""The worker's status line: Claude Code hands it the account's usage windows
(``inpane.hooks.status_line``)."""


def claude_argv(claude_bin: str, role: Role, model: str, *, plugin: Path,
                extra_args: Sequence[str] = (), resume: str | None = None,
                workspace: Path | None = None) -> list[str]:
    """Claude Code's argv, without the prompt (the exec wrapper adds it after ``--``)."""
    fence = tool_fence(role, workspace)
    return [
        *([claude_bin, "--resume", resume] if resume else [claude_bin]),
        "--model", model,
        "--plugin-dir", str(plugin),
        # (a plugin cannot set the status line) it tells the account's usage windows
        "--settings", STATUS_LINE_SETTINGS,
        "--permission-mode", "dontAsk",
        "--tools", ",".join(fence.tools),
        "--allowedTools", ",".join(fence.allowed),
        "--disallowedTools", ",".join(fence.disallowed),
        *extra_args,
        "--",
    ]


def prepare_claude(settings: ProjectSettings, env: Mapping[str, str], home: Path,
                    trust: Sequence[Path]) -> str:
    """Seed the HOME claude will use (no first-run screen) and find the binary."""
    if settings.agent.home == "isolated":
        home.mkdir(parents=True, exist_ok=True)
        home.chmod(0o700)
    seed_claude_config(
        claude_config_file(env),
        trust=trust,
        isolated=settings.agent.home == "isolated",
        api_key=env.get("ANTHROPIC_API_KEY"),
    )
    return resolve_claude_bin(settings, env["PATH"])


def claude_version(claude_bin: str) -> CommandResult:
    """``claude --version`` (doctor): the one other place ralph-dev runs the binary."""
    return run_command([claude_bin, "--version"], timeout=30)

