"""Typed, validated settings: defaults → config.toml → environment → CLI flags.

Where the files are is ``core.paths``; writing a project's table (``init``) is
``adapters.config_file``. Errors name the file, the key and what is wrong, because a person fixing a
config at 2 a.m. should not have to guess which of three tables is meant.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ralph_dev.core.config_rules import validate
from ralph_dev.core.costs import CostSettings
from ralph_dev.core.environment import OWN_PREFIXES, OWN_VARIABLES
from ralph_dev.core.errors import ConfigError, UnknownProject
from ralph_dev.core.groom import GroomSettings
from ralph_dev.core.model import Role
from ralph_dev.core.paths import ProjectPaths, check_project_name, config_file
from ralph_dev.core.typed_toml import coerce

# --- settings ------------------------------------------------------------------

@dataclass(frozen=True)
class TrackerSettings:
    kind: Literal["local", "linear"] = "local"
    key: str = ""
    """Identifier prefix of the local tracker (``KEY`` in ``KEY-N``)."""
    linear_project: str | None = None  # Linear project id, slug or name
    linear_api_key_file: Path | None = None
    linear_team: str | None = None
    """Key of the Linear team new issues without a parent go to (needed when the
    project has several teams; an issue with a parent goes to the parent's team)."""
    linear_new_state: str | None = None
    """State new issues are created in (a name every team has); default: each team's
    first state of type "unstarted" (Todo), where ralph-dev dispatches from."""
    full_sync_interval: float = 1800.0
    """Seconds between full Linear re-reads (a safety net: polls see issue, comment
    and relation changes; what they cannot, such as an issue moved out of the
    project, waits for this)."""
    linear_poll_interval: float = 30.0
    """Seconds between Linear polls; controller ticks in between reuse what the last
    poll saw (a write by another ralph-dev process of the project forces a poll)."""
    webhook_port: int | None = None
    webhook_host: str = "127.0.0.1"


@dataclass(frozen=True)
class AgentSettings:
    runner: Literal["claude", "command"] = "claude"
    """``claude``: a supervised agent CLI, the one ``cli`` names (Claude Code unless it
    says otherwise); ``command``: any program, ``command``."""
    cli: Literal["claude", "codex", "gemini"] = "claude"
    """The agent CLI workers run (``core.agent_profiles``); a role's ``roles.ROLE.cli``
    wins."""
    command: str | None = None
    """Template for the ``command`` runner: ``{issue}``, ``{role}``, ``{workspace}``,
    ``{prompt_file}`` placeholders, split like a shell line but never run by one."""
    claude_bin: str = "claude"
    codex_bin: str = "codex"
    """The Codex CLI program: a path, or a name looked up on the workers' PATH."""
    gemini_bin: str = "gemini"
    """The Gemini CLI program: a path, or a name looked up on the workers' PATH."""
    model: str | None = None
    """None: the CLI's own default (Claude Code: ``sonnet``)."""
    models: Mapping[str, str] = field(default_factory=dict)
    """Per-role model overrides, e.g. ``{plan = "opus"}``."""
    iteration_cap: int = 25
    """Stop-hook continuations before an agent may stop without reporting."""
    extra_args: tuple[str, ...] = ()
    supervisor: bool = False
    pass_env: tuple[str, ...] = ()
    """Further variables agents get from ralph-dev's environment (a command runner's own
    settings); everything else outside the allowlist stays back."""
    """When controller restarts do not help (a crash loop), run the supervisor once
    (``claude -p`` with the ralph-dev-supervisor skill and a status snapshot)."""
    home: Literal["user", "isolated"] = "user"
    """HOME of ``claude`` workers: ``user`` keeps the person's own HOME (their login
    and settings); ``isolated`` uses a private, pre-seeded one under the data dir
    (API-key users, tests, the demo). Either way ralph-dev marks the workspace root
    trusted so no first-run screen waits for a keypress."""
    sandbox: Literal["bwrap", "off"] = "bwrap"
    """``bwrap``: each worker confined by bubblewrap (``agent.sandbox``); ``off``: none."""
    shared_paths: tuple[str, ...] = ()
    """Absolute paths every sandboxed worker may also write (a shared cache): name few."""
    network: Literal["open", "allowlist", "none"] = "open"
    """What a sandboxed worker can reach: ``open`` (the machine's network), ``allowlist``
    (only through ralph-dev's egress proxy: its agent's API, ``allow_hosts``, the cluster's
    git remote) or ``none`` (nothing)."""
    allow_hosts: tuple[str, ...] = ()
    """With ``network = "allowlist"``: more hosts workers may reach (``registry.npmjs.org``,
    ``pypi.org:443``, ``*.githubusercontent.com``)."""


@dataclass(frozen=True)
class RoleAgent:
    """Which agent CLI and model one role's workers run (``[projects.NAME.roles.ROLE]``):
    review on Codex beside execute on Claude Code."""

    cli: Literal["claude", "codex", "gemini"] | None = None
    """None: ``agent.cli``."""
    model: str | None = None
    """None: ``agent.models.ROLE`` / ``agent.model`` when the role runs the project's
    CLI, else that CLI's default model."""


@dataclass(frozen=True)
class Limits:
    max_workers: int = 3
    per_role: Mapping[str, int] = field(default_factory=dict)
    """Caps per role, e.g. ``{plan = 1}``; a role not named is capped only globally."""
    plan_issues: int = 50
    """The most issues one plan worker's plan may create."""
    plan_issues_per_hour: int = 200
    """The most issues plan workers may create in any hour, all plans together."""
    min_free_memory_mb: int = 1024  # no new worker below these (core/decide/swarm.py)
    min_free_disk_mb: int = 1024  # free on the workspaces' filesystem
    max_load_per_cpu: float = 4.0  # 1-minute load average per CPU; 0: no limit


@dataclass(frozen=True)
class Timing:
    poll_interval: float = 10.0
    stall_timeout: float = 900.0
    """Seconds without activity before a live worker is nudged: for Claude Code its hooks
    and transcript (a spinner over a hung model call is not activity), for the command
    runner its pane."""
    restart_timeout: float = 900.0
    """Seconds after a nudge, still unchanged, before the worker is restarted."""
    hang_timeout: float = 90.0
    """Seconds a Claude Code worker may wait for the model with no sign of life before its
    call is taken for hung: it is restarted in its own session, free (a nudge typed into a
    pane frozen on a model call does nothing)."""
    retry_base: float = 30.0
    retry_cap: float = 1800.0
    max_attempts: int = 3
    health_interval: float = 180.0
    heartbeat_stale: float = 120.0
    """A controller heartbeat older than this is a dead controller."""
    outage_wait: float = 10.0  # first step of an API outage's probes; doubles up to 30 s
    tripwire_interval: float = 30.0  # between walks of files no worker may change
    crash_loop_restarts: int = 5
    crash_loop_window: float = 900.0


@dataclass(frozen=True)
class Labels:
    user_input_needed: str = "user-input-needed"
    user_feedback_given: str = "user-feedback-given"
    agent_feedback_given: str = "agent-feedback-given"
    agent_input_needed: str = "agent-input-needed"
    plan: str = "ralph:plan"
    research: str = "ralph:research"
    review: str = "ralph:review"
    hold: str = "ralph:hold"
    phase: str = "ralph:phase"
    """Marks a phase/parent issue: with no children yet it goes to a plan worker."""
    groom: str = "ralph:groom"
    """Its issue is a groom run (a person asks for one by labeling an issue)."""
    proposed: str = "ralph:proposed"
    """An issue a groom worker proposed (in a backlog state until a person accepts it)."""
    model_prefix: str = "model:"

    def steering(self) -> tuple[str, ...]:
        """Every label ralph-dev reads or writes (what ``init`` makes sure exists)."""
        return (
            self.user_input_needed,
            self.user_feedback_given,
            self.agent_feedback_given,
            self.agent_input_needed,
            self.plan,
            self.research,
            self.review,
            self.hold,
            self.phase,
            self.groom,
            self.proposed,
        )

    def person_only(self) -> tuple[str, ...]:
        """Labels that speak for a person (a hold, an answer, a question): never set by a
        plan or an agent (nor a groom run: a person asks for one). Role labels (plan,
        research, review, phase) a plan may use."""
        return (self.user_input_needed, self.user_feedback_given, self.agent_feedback_given,
                self.agent_input_needed, self.hold, self.groom)


@dataclass(frozen=True)
class MergeSettings:
    mode: Literal["local", "pr"] = "local"
    """``local`` merges into trunk here; ``pr`` pushes the worker's bookmark to
    ``remote`` and opens a pull request with ``gh`` instead."""
    remote: str = "origin"
    gh_bin: str = "gh"
    verify_trunk: bool = False
    """Run the verify command on trunk after each merge; red trunk stops merges."""
    verified: bool = True
    """Local mode with a verify command: each change is verified on top of trunk first."""
    max_batch: int = 8
    """Changes ready to merge together that are verified together (the verified lane): a
    green batch lands at once, a red one is bisected to the change that broke it. 1: one
    change at a time."""
    parallel_verifies: int = 1
    """Verifies the lane runs at once: beside a batch's, its prefixes' speculatively, so a
    red batch is bisected in fewer rounds (for long suites). Each one beyond the first
    starts only while the host has a CPU free and ``verify_memory_mb`` free for it."""
    verify_memory_mb: int = 1024
    """Memory one verify takes, above ``limits.min_free_memory_mb``: how many run at once
    is bounded by the host's free memory with it."""


@dataclass(frozen=True)
class WorkspaceHooks:
    """Shell lines from the project's own config (never from an issue), run with
    ``/bin/sh -c`` in a worker's workspace, like other orchestrators' setup scripts."""

    after_create: str | None = None
    """In a new workspace before its agent starts (copy .env, install dependencies);
    a failure is a failed spawn, and the workspace is removed again."""
    before_remove: str | None = None
    """In a workspace about to be removed (its work is safe); a failure is reported."""
    timeout: float = 600.0
    """Seconds either may run before it is killed (and counted as failed)."""


@dataclass(frozen=True)
class WebSettings:
    """The dashboard, state API and metrics the daemon serves."""

    enabled: bool = True
    host: str = "127.0.0.1"
    """Loopback by default; any other address needs an access token."""
    port: int = 0
    """0 = any free port (the URL shows in ``ralph-dev status``); a fixed port for
    Prometheus to scrape."""
    token_file: Path | None = None
    """A file (chmod 600) holding the access token; or set ``RALPH_DEV_WEB_TOKEN``."""


@dataclass(frozen=True)
class NotifySettings:
    """Telling a person when the swarm needs them (the daemon sends these)."""

    urls: tuple[str, ...] = ()
    """Apprise URLs (``ntfy://…``, ``mailto://…``, ``json://…``): where messages go."""
    command: str | None = None
    """A command run per message with the message as JSON on stdin; split like a
    shell line, never run by one."""
    on_merge: bool = False
    """Also tell about each merge (not only when a person is needed)."""
    cooldown: float = 900.0
    """Seconds after a cause cleared during which it coming back is not told again."""
    max_per_hour: int = 20
    """Messages per hour at most; the rest are counted and mentioned in the next one."""


@dataclass(frozen=True)
class PatternSettings:
    """Pattern learning (``core.patterns``): the project's own decomposition strategies."""

    strategies: Mapping[str, str] = field(default_factory=dict)
    """name → case-insensitive regex, added to (or replacing) the shipped vocabulary."""


@dataclass(frozen=True)
class ClusterSettings:
    """Workers on other hosts (``[projects.NAME.cluster]``). Without the table every
    worker runs on this host and the cluster engine is never imported."""

    engine: Literal["ray"] = "ray"
    """The only engine: Ray places each worker attempt on a host with a free slot."""
    address: str = "auto"
    """The Ray cluster's address (``HOST:6379``, ``ray://HOST:10001``), or ``auto``: the
    cluster this host joined with ``ray start``."""
    remote: str | None = None
    """A git URL every host can fetch from and push to: workers' code comes back through
    it. None: the project repository's own remote (``merge.remote``)."""
    snapshot_interval: float = 300.0
    """Seconds between a worker's work-in-progress pushes: what a lost host loses at
    most."""
    lease: float = 30.0
    """Seconds an attempt runs on without hearing from the controller: its host stops
    the agent before they are up, and the controller starts no next attempt of the issue
    until they (and a margin) have passed since it last reached the host. Never two
    agents on one issue, whatever the network does."""
    warm: int = 2
    """Attempts' processes kept started on free slots before they are wanted: a spawn
    then takes one (about 0.2 s) instead of waiting for Ray to start a process (about
    1 s). Each holds its slot, so a host kept warm is never idle: with ``max_hosts``
    they are kept only while issues wait for a slot, and idle hosts still go. 0: none."""
    max_hosts: int | None = None
    """Hosts Ray's autoscaler is asked for at most when ready issues wait for a slot
    (``ray.autoscaler.sdk.request_resources``; on KubeRay, worker pods). None: as many
    as the waiting issues need, within ``limits.max_workers``."""


@dataclass(frozen=True)
class HostSettings:
    """What every project on this host shares (the config's top-level ``[host]``)."""

    max_workers: int | None = None
    """Workers at most on this host, all projects together (None: only each project's
    own ``limits.max_workers``). Cluster projects' workers run elsewhere and do not
    count."""
    worker_memory_mb: int = 512
    """The memory a worker is taken to need while it starts (its first minute, before
    it has taken it): with ``max_workers``, each start on the host, all projects
    together, is admitted only if the free memory covers every worker still starting
    and this one above ``limits.min_free_memory_mb``. 0: only that floor."""


HOST_TABLE = "host"
"""The config's top-level table of the host's settings; each project's settings carry
it (``ProjectSettings.host``), so a change to it reaches every controller live."""


@dataclass(frozen=True)
class AccountSettings:
    """One account's settings: the config's top-level ``[accounts.NAME]``, NAME being the
    account as ``status`` names it, or ``default`` for every account not named."""

    reserve: float = 0.2
    """The share of each of the account's usage windows kept for the person's own use:
    new workers stop starting once the rest is used, and are slowed before
    (``core.pacing``)."""


ACCOUNTS_TABLE = "accounts"
"""The config's top-level table of accounts, carried by every project like ``[host]``."""
DEFAULT_ACCOUNT = "default"
SHARED_TABLES = (HOST_TABLE, ACCOUNTS_TABLE)
"""Top-level tables every project's settings carry: they are the host's, not a project's."""


@dataclass(frozen=True)
class ProjectSettings:
    name: str
    repo: Path
    trunk: str = "main"
    workspace_root: Path | None = None
    verify_command: str | None = None
    """Shell line from the project's own config (never from an issue), run in the
    workspace before an agent may call an issue done."""
    tmux_socket: str | None = None
    """tmux ``-L`` socket name; None = the user's normal server."""
    review_state: str = "In Review"
    """State name that routes an issue to a review worker."""
    review_after_execute: bool = False
    """``worker done`` of an execute worker moves the issue to review_state, not done."""
    tracker: TrackerSettings = field(default_factory=TrackerSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)
    limits: Limits = field(default_factory=Limits)
    timing: Timing = field(default_factory=Timing)
    labels: Labels = field(default_factory=Labels)
    merge: MergeSettings = field(default_factory=MergeSettings)
    hooks: WorkspaceHooks = field(default_factory=WorkspaceHooks)
    web: WebSettings = field(default_factory=WebSettings)
    notify: NotifySettings = field(default_factory=NotifySettings)
    patterns: PatternSettings = field(default_factory=PatternSettings)
    groom: GroomSettings = field(default_factory=GroomSettings)
    costs: CostSettings = field(default_factory=CostSettings)
    cluster: ClusterSettings | None = None
    """None (no ``[cluster]`` table): every worker on this host."""
    roles: Mapping[str, RoleAgent] = field(default_factory=dict)
    """Per role, the agent CLI and model its workers run (``[projects.NAME.roles.ROLE]``)."""
    share: float = 1.0
    """This project's weight when projects compete for the host's workers
    (``[host] max_workers``): a project of share 2 gets twice the workers of one of
    share 1 while both wait for more."""
    host: HostSettings = field(default_factory=HostSettings)
    """The host's own settings (the top-level ``[host]``, never a project's table)."""
    accounts: Mapping[str, AccountSettings] = field(default_factory=dict)
    """The accounts' settings (the top-level ``[accounts.NAME]`` tables)."""

    def account_settings(self, account: str) -> AccountSettings:
        """The settings of the account named ``account`` (its fingerprint)."""
        return self.accounts.get(account) or self.accounts.get(DEFAULT_ACCOUNT) \
            or AccountSettings()

    @property
    def paths(self) -> ProjectPaths:
        return ProjectPaths(self.name)

    @property
    def verifies_merges(self) -> bool:
        """Trunk moves only to a change that passed the verify command on top of it."""
        return bool(self.merge.verified and self.verify_command and self.merge.mode == "local")

    @property
    def workspaces(self) -> Path:
        return self.workspace_root or self.paths.default_workspace_root

    @property
    def key(self) -> str:
        return self.tracker.key or default_key(self.name)

    @property
    def session_name(self) -> str:
        return f"ralph-{self.name}"

    def role_limit(self, role: Role) -> int:
        return int(self.limits.per_role.get(role.value, self.limits.max_workers))


def default_key(project: str) -> str:
    """A local-tracker key from a project name: ``my-app`` → ``MYAPP``."""
    letters = re.sub(r"[^A-Za-z0-9]", "", project).upper()
    if not letters or not letters[0].isalpha():
        letters = "R" + letters
    return letters[:10]


# --- parsing -------------------------------------------------------------------

_SECTIONS: dict[str, type] = {
    "tracker": TrackerSettings,
    "agent": AgentSettings,
    "limits": Limits,
    "timing": Timing,
    "labels": Labels,
    "merge": MergeSettings,
    "hooks": WorkspaceHooks,
    "web": WebSettings,
    "notify": NotifySettings,
    "patterns": PatternSettings,
    "groom": GroomSettings,
    "costs": CostSettings,
    "cluster": ClusterSettings,
    HOST_TABLE: HostSettings,
}


def _build(cls: type, raw: Mapping[str, Any], where: str, **fixed: Any) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r} (known keys: {', '.join(sorted(known))})"
        )
    values: dict[str, Any] = dict(fixed)
    for name, value in raw.items():
        if name in fixed:
            continue
        tp = hints[name]
        if name == ACCOUNTS_TABLE and cls is ProjectSettings:
            if not isinstance(value, Mapping) or not all(
                    isinstance(v, Mapping) for v in value.values()):
                raise ConfigError(f"{ACCOUNTS_TABLE}: expected [{ACCOUNTS_TABLE}.NAME] tables "
                                  f"(e.g. reserve = 0.2), got {value!r}")
            values[name] = {str(account): _build(AccountSettings, table,
                                                 f"{ACCOUNTS_TABLE}.{account}")
                            for account, table in value.items()}
        elif name == "roles" and cls is ProjectSettings:
            if not isinstance(value, Mapping) or not all(
                    isinstance(v, Mapping) for v in value.values()):
                raise ConfigError(f"{where}.roles: expected [{where}.roles.ROLE] tables "
                                  f"(e.g. cli = \"codex\"), got {value!r}")
            values[name] = {str(role): _build(RoleAgent, table, f"{where}.roles.{role}")
                            for role, table in value.items()}
        elif name in _SECTIONS and cls is ProjectSettings:
            within = name if name == HOST_TABLE else f"{where}.{name}"
            if not isinstance(value, Mapping):
                raise ConfigError(f"{within}: expected a table, got {value!r}")
            values[name] = _build(_SECTIONS[name], value, within)
        else:
            values[name] = coerce(value, tp, f"{where}.{name}")
    return cls(**values)


# Environment overrides: RALPH_DEV_<SECTION>_<KEY> for scalar settings, plus a
# few names people already know. Values are parsed as TOML scalars so
# ``RALPH_DEV_LIMITS_MAX_WORKERS=5`` is an int and ``…=abc`` a clear error.
_ENV_ALIASES = {
    "RALPH_DEV_TMUX_SOCKET": ("tmux_socket",),
}

def setting_variables() -> dict[str, tuple[str, ...]]:
    """Every environment variable that overrides a setting, and the setting's key path."""
    names: dict[str, tuple[str, ...]] = dict(_ENV_ALIASES)
    for section, cls in _SECTIONS.items():
        for f in dataclasses.fields(cls):
            names[f"RALPH_DEV_{section}_{f.name}".upper()] = (section, f.name)
    for f in dataclasses.fields(ProjectSettings):
        if f.name not in ("name", "roles", ACCOUNTS_TABLE) and f.name not in _SECTIONS:
            names[f"RALPH_DEV_{f.name}".upper()] = (f.name,)
    return names


def _env_overrides(environ: Mapping[str, str]) -> dict[tuple[str, ...], tuple[str, str]]:
    """The settings ``environ`` overrides. An unknown ``RALPH_DEV_*`` variable is an error
    naming the closest one: a typo (``…_MAX_WORKER=5``) must not be ignored in silence."""
    settings = setting_variables()
    found: dict[tuple[str, ...], tuple[str, str]] = {}
    for var, value in environ.items():
        if not var.startswith("RALPH_DEV_"):
            continue
        path = settings.get(var.upper())
        if path is not None:
            found[path] = (var, value)
        elif var not in OWN_VARIABLES and not var.startswith(OWN_PREFIXES):
            close = difflib.get_close_matches(var.upper(), [*settings, *OWN_VARIABLES], n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(
                f"environment variable {var}: ralph-dev has no such setting; {hint}(settings "
                "are RALPH_DEV_<SECTION>_<KEY>, e.g. RALPH_DEV_LIMITS_MAX_WORKERS; unset it "
                "if it is not meant for ralph-dev)")
    return found


def _parse_env_value(var: str, text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word is a string (paths, model names)


def _apply(table: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        table = table.setdefault(part, {})
    table[path[-1]] = value


def read_config_file(path: Path | None = None) -> dict[str, Any]:
    path = path or config_file()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    projects = data.get("projects", {})
    if not isinstance(projects, dict):
        raise ConfigError(f"{path}: 'projects' must be a table of [projects.NAME] tables")
    return data


def project_names(path: Path | None = None) -> list[str]:
    return sorted(read_config_file(path).get("projects", {}))


def load_project(
    name: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    path: Path | None = None,
) -> ProjectSettings:
    """Settings for one project: defaults → file → environment → ``overrides``.

    ``overrides`` uses dotted keys (``"limits.max_workers"``) as CLI flags do.
    """
    path = path or config_file()
    return project_from_table(name, read_project_table(name, path), path, overrides, environ)


def read_project_table(name: str, path: Path) -> Any:
    """Project ``name``'s table as the file holds it now, read once (unchecked)."""
    check_project_name(name)
    projects = read_config_file(path).get("projects", {})
    if name not in projects:
        known = ", ".join(sorted(projects)) or "none"
        raise UnknownProject(
            f"unknown project {name!r} (configured in {path}: {known}); "
            f"create it with: ralph-dev init {name} --repo PATH"
        )
    return with_shared(name, projects[name], read_config_file(path), path)


def with_shared(name: str, table: Any, config: Mapping[str, Any], path: Path) -> Any:
    """A project's table with the host's shared tables (``[host]``, ``[accounts]``) in
    it: a project's settings carry what its host shares. Those tables are the host's
    alone."""
    if not isinstance(table, dict):
        return table
    for shared in SHARED_TABLES:
        if shared in table:
            raise ConfigError(
                f"{path}: projects.{name}.{shared}: these settings hold across every "
                f"project on this host: write them once, in a top-level [{shared}] table")
    return {**table, **{shared: config[shared] for shared in SHARED_TABLES
                        if config.get(shared) is not None}}


def project_from_table(name: str, raw: Any, path: Path,
                       overrides: Mapping[str, Any] | None = None,
                       environ: Mapping[str, str] | None = None) -> ProjectSettings:
    """Settings from a project's table as the file holds it (``path`` names the file in
    errors), with the environment's and the command line's overrides applied."""
    environ = os.environ if environ is None else environ
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: projects.{name}: expected a table")
    merged: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    sources: dict[tuple[str, ...], str] = {}
    for key_path, (var, text) in _env_overrides(environ).items():
        _apply(merged, key_path, _parse_env_value(var, text))
        sources[key_path] = f"environment variable {var}"
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        key_path = tuple(dotted.split("."))
        _apply(merged, key_path, value)
        sources[key_path] = f"command-line option for {dotted}"
    if "repo" not in merged:
        raise ConfigError(f"{path}: projects.{name}.repo: missing (the project's repository path)")
    try:
        settings = build_project(name, merged)
    except ConfigError as exc:
        message = str(exc)
        for key_path, source in sources.items():
            if message.startswith(f"projects.{name}." + ".".join(key_path) + ":"):
                raise ConfigError(f"{source}: {message}") from None
        raise ConfigError(f"{path}: {message}") from None
    return settings


def build_project(name: str, raw: Mapping[str, Any]) -> ProjectSettings:
    """Typed, validated settings from one raw ``[projects.NAME]`` table."""
    where = f"projects.{name}"
    settings: ProjectSettings = _build(ProjectSettings, raw, where, name=name)
    validate(settings, where)
    return settings




RESTART_NEEDED = ("repo", "trunk", "workspace_root", "tmux_socket", "tracker", "web",
                  "cluster")
"""Settings a running swarm cannot take live: they name the repository, the tracker and
its client, the tmux server, the dashboard's socket and the cluster connection that the
running processes hold.
Everything else (limits, timing, labels, agent and models, merge, hooks, budgets,
notifications, grooming, patterns, verify) applies from the next tick."""


def changed_settings(old: object, new: object, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two settings (nested tables compared
    key by key), in declaration order."""
    if not (dataclasses.is_dataclass(old) and dataclasses.is_dataclass(new)):
        return [] if old == new else [prefix]
    out: list[str] = []
    for f in dataclasses.fields(old):
        key = f"{prefix}.{f.name}" if prefix else f.name
        out += changed_settings(getattr(old, f.name), getattr(new, f.name), key)
    return out


def live_settings(running: ProjectSettings, new: ProjectSettings
                  ) -> tuple[ProjectSettings, list[str], list[str]]:
    """What a running swarm takes from ``new``: (the settings to run with — ``new`` but
    for what needs a restart, kept as it runs — the keys applied, the keys that wait
    for a restart)."""
    changed = changed_settings(running, new)
    later = [k for k in changed if k.split(".")[0] in RESTART_NEEDED]
    kept = {name: getattr(running, name) for name in RESTART_NEEDED}
    return (dataclasses.replace(new, **kept), [k for k in changed if k not in later], later)
