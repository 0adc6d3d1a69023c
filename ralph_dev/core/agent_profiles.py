"""Agent CLIs as data: one profile per CLI ralph-dev can supervise.

ralph-dev runs each worker's agent through a profile, never by a CLI's name: how
to start it fresh and resumed, how it gets the prompt, its model flag, where its
session and transcript live, which of its own signals say it is busy, idle,
asking, rate-limited or out of quota, and how to check it is installed. Adding a
CLI is adding a profile here (and, for what it needs on disk before it starts, a
preparer in ``agent`` and a driver in ``agent.launch``); the ``command`` runner stays
for any other program, with no supervision beyond its pane.

The profiles are plain data so that both the pure core (config validation, which
model a role gets, whether a worker's state comes from its own signals) and the
launch side read the same description. What a profile says about a CLI was
checked against the version it pins (``pinned``), which ``scripts/setup.sh``
installs and the tests drive against a scripted fake of its provider's API.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ralph_dev.core.config import ProjectSettings
    from ralph_dev.core.model import Role

PromptPassing = Literal["argument", "after_double_dash", "stdin"]
"""How a CLI takes the prompt: its last argv word (``after_double_dash``: behind a
``--`` so no prompt text is ever read as an option), or on its stdin (its supervisor
takes the launcher's last word and writes it there: Gemini CLI reads a word that
starts with ``-`` behind ``--prompt`` as an option)."""

Signals = Literal["hooks", "events"]
"""How a CLI tells its supervisor what it does: ``hooks`` (a program run at each
event, with the event as JSON on stdin: Claude Code's, the agent's state live) or
``events`` (one JSON event per line on its stdout, read by ralph-dev's supervisor in its
pane: Codex's ``exec --json``, ``inpane.codex_exec``; Gemini CLI's ``--output-format
stream-json``, ``inpane.gemini_exec``)."""


@dataclass(frozen=True)
class AgentProfile:
    """One agent CLI, as ralph-dev starts and watches it."""

    name: str
    """The config's name for it (``agent.cli``, ``roles.ROLE.cli``)."""
    title: str
    """What people call it, for messages."""
    package: str
    """The npm package it is published as."""
    pinned: str
    """The version ``scripts/setup.sh`` installs, the tests drive, and this profile
    describes."""
    program: str
    """The executable's name (on PATH, or in ``node_modules/.bin`` of the set-up copy)."""
    bin_setting: str
    """The ``agent.*`` key naming its program (a path, or a name looked up on PATH)."""
    bin_variable: str
    """The variable that points the set-up scripts, tests and demo at a copy."""
    fresh: tuple[str, ...]
    """The argv words after the program for a new session (options follow)."""
    resumed: tuple[str, ...] | None
    """The same for continuing session ``{session}``; None: the CLI cannot resume."""
    prompt: PromptPassing
    model_flag: str
    default_model: str
    """The model a role gets when neither a label nor the config names one."""
    home_variable: str | None
    """The variable that moves the CLI's whole config home (isolated per worker)."""
    home_dir: str
    """Its config home under HOME when that variable is unset."""
    key_variables: tuple[str, ...]
    """The API key(s) it reads: the only secrets of the agent's provider it gets."""
    base_url_variable: str
    """The variable that points it at another API endpoint (the tests' fake on loopback)."""
    env_prefixes: tuple[str, ...]
    """Variables of ralph-dev's environment it is given (how it reaches its model), on
    top of the allowlist every agent gets. Another provider's keys never pass."""
    transcript: str
    """Where a session's transcript lives, a pattern under its config home."""
    signals: Signals
    states: Mapping[str, str] = field(default_factory=dict)
    api_hosts: tuple[str, ...] = ()
    """The hosts its model API and login are on, for a worker without network but
    through the egress proxy (``agent.network = "allowlist"``); its base URL variable's
    host is allowed too."""
    login_variables: tuple[str, ...] = ()
    """Variables that carry a subscriber's login (not an API key): with the key
    variables, what names the account its workers spend (``adapters.accounts``)."""
    """How it says busy, idle, asking, rate_limited and out_of_quota: the event or
    text ralph-dev reads each from."""
    version_args: tuple[str, ...] = ("--version",)
    """Its install check: exits 0 and prints its version."""
    supports: Mapping[str, bool] = field(default_factory=dict)
    """What ralph-dev can do with it (the README's table): resume, live_state,
    questions, cost."""

    @property
    def reports_state(self) -> bool:
        """The worker's activity and state come from the agent's own signals (hooks and
        its transcript), not from its pane: a spinner over a hung call is no activity."""
        return bool(self.supports.get("live_state"))

    @property
    def resumes(self) -> bool:
        return self.resumed is not None

    def start_words(self, session: str | None) -> tuple[str, ...]:
        """The argv words after the program: a fresh start, or session ``session``'s."""
        if session is None or self.resumed is None:
            return self.fresh
        return tuple(word.replace("{session}", session) for word in self.resumed)


CLAUDE = AgentProfile(
    name="claude", title="Claude Code", package="@anthropic-ai/claude-code", pinned="2.1.197",
    program="claude", bin_setting="claude_bin", bin_variable="RALPH_DEV_CLAUDE_BIN",
    fresh=(), resumed=("--resume", "{session}"), prompt="after_double_dash",
    model_flag="--model", default_model="sonnet",
    home_variable="CLAUDE_CONFIG_DIR", home_dir=".claude",
    key_variables=("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"),
    base_url_variable="ANTHROPIC_BASE_URL", env_prefixes=("ANTHROPIC_", "CLAUDE_CODE_"),
    transcript="projects/<workspace, slashes as dashes>/<session>.jsonl",
    signals="hooks", login_variables=("CLAUDE_CODE_OAUTH_TOKEN",),
    api_hosts=("api.anthropic.com", "console.anthropic.com", "statsig.anthropic.com"),
    states={
        "busy": "UserPromptSubmit / PreToolUse / PostToolUse hooks",
        "idle": "Stop hook (the Ralph loop decides whether it may stop)",
        "asking": "AskUserQuestion tool, or a turn ending on a question",
        "rate_limited": "StopFailure hook with a 429 (reset read from the API)",
        "out_of_quota": "StopFailure hook with the subscriber's limit text",
    },
    supports={"resume": True, "live_state": True, "questions": True, "cost": True},
)

CODEX = AgentProfile(
    name="codex", title="Codex CLI", package="@openai/codex", pinned="0.171.0",
    program="codex", bin_setting="codex_bin", bin_variable="RALPH_DEV_CODEX_BIN",
    fresh=("exec", "--json"), resumed=("exec", "--json", "resume", "{session}"),
    prompt="argument",
    model_flag="--model", default_model="gpt-5-codex",
    home_variable="CODEX_HOME", home_dir=".codex",
    key_variables=("OPENAI_API_KEY",), base_url_variable="OPENAI_BASE_URL",
    env_prefixes=("OPENAI_",), api_hosts=("api.openai.com", "chatgpt.com", "auth.openai.com"),
    transcript="sessions/YYYY/MM/DD/rollout-<time>-<session>.jsonl",
    signals="events",
    states={
        "busy": "`exec --json` events: turn.started, item.started/completed",
        "idle": "turn.completed; `exec` exits with its turn",
        "asking": "its turn's last agent_message ends on a question, and it reported "
                  "nothing",
        "rate_limited": "error / turn.failed naming a rate limit; `exec` exits non-zero",
        "out_of_quota": "error / turn.failed: \"You've hit your usage limit … try again at "
                        "2:23 AM\" (429 usage_limit_reached), its local time",
    },
    supports={"resume": True, "live_state": True, "questions": True, "cost": True},
)

GEMINI = AgentProfile(
    name="gemini", title="Gemini CLI", package="@google/gemini-cli", pinned="0.61.0",
    program="gemini", bin_setting="gemini_bin", bin_variable="RALPH_DEV_GEMINI_BIN",
    fresh=("--output-format", "stream-json", "--approval-mode", "yolo"),
    resumed=("--output-format", "stream-json", "--approval-mode", "yolo",
             "--resume", "{session}"),
    prompt="stdin",
    model_flag="--model", default_model="gemini-2.5-pro",
    home_variable="GEMINI_CLI_HOME", home_dir=".gemini",
    key_variables=("GEMINI_API_KEY",), base_url_variable="GOOGLE_GEMINI_BASE_URL",
    env_prefixes=("GEMINI_", "GOOGLE_GEMINI_"),
    api_hosts=("generativelanguage.googleapis.com", "cloudcode-pa.googleapis.com",
               "oauth2.googleapis.com"),
    transcript="tmp/<project>/chats/session-<time>-<session's first 8>.jsonl",
    signals="events",
    states={
        "busy": "`--output-format stream-json` events: init, tool_use, tool_result",
        "idle": "result (status success); headless Gemini CLI exits with its turn",
        "asking": "its turn's last assistant message ends on a question, and it reported "
                  "nothing",
        "rate_limited": "a retry it announces on stderr (\"Retrying after 5519ms\"), the "
                        "model's silence, not a hang",
        "out_of_quota": "result (status error): \"exhausted your daily quota\" (resets at "
                        "midnight Pacific), \"Suggested retry after 3600s\", \"Your quota "
                        "will reset after 1h2m3s\"",
    },
    supports={"resume": True, "live_state": True, "questions": True, "cost": True},
)
"""``home_variable`` names the directory its ``.gemini`` is in (not the ``.gemini``
itself, as ``CODEX_HOME`` is Codex's)."""

PROFILES: Mapping[str, AgentProfile] = {p.name: p for p in (CLAUDE, CODEX, GEMINI)}
"""Every agent CLI ralph-dev knows, by its config name."""

SUPPORTED = tuple(PROFILES)
"""The CLIs a worker may run: each pinned and tested against its fake API."""

COMMAND = "command"
"""``agent.runner = "command"``: any other program, supervised only through its pane."""


def profile(name: str) -> AgentProfile:
    """The profile named ``name`` (a validated config's value: always known)."""
    return PROFILES[name]


def role_cli(settings: ProjectSettings, role: Role | str) -> str:
    """What runs ``role``'s workers: a profile's name, or ``command``. A role's own
    ``roles.ROLE.cli`` wins; else the project's ``agent.cli``, or its command runner."""
    value = role if isinstance(role, str) else role.value
    own = settings.roles.get(value)
    if own is not None and own.cli is not None:
        return own.cli
    return COMMAND if settings.agent.runner == COMMAND else settings.agent.cli


def role_profile(settings: ProjectSettings, role: Role | str) -> AgentProfile | None:
    """The profile ``role``'s workers run under; None for the command runner."""
    name = role_cli(settings, role)
    return None if name == COMMAND else PROFILES[name]


def role_model(settings: ProjectSettings, role: Role | str) -> str:
    """The configured model of ``role``: ``roles.ROLE.model``, else (when the role runs
    the project's own CLI) ``agent.models.ROLE`` or ``agent.model``, else its CLI's
    default. A ``model:X`` label on an issue wins over all of these (``decide``)."""
    value = role if isinstance(role, str) else role.value
    own = settings.roles.get(value)
    if own is not None and own.model:
        return own.model
    cli = role_cli(settings, value)
    project_cli = COMMAND if settings.agent.runner == COMMAND else settings.agent.cli
    if cli == project_cli:
        configured = settings.agent.models.get(value) or settings.agent.model
        if configured:
            return configured
    return PROFILES[cli].default_model if cli in PROFILES else CLAUDE.default_model


def aware_roles(settings: ProjectSettings) -> frozenset[Role]:
    """The roles whose workers report their state through their CLI's own signals (their
    activity is the agent's account, not their pane's output)."""
    from ralph_dev.core.model import Role

    return frozenset(r for r in Role
                     if (p := role_profile(settings, r)) is not None and p.reports_state)
