"""The one environment and secret policy: which variables each kind of process gets.

ralph-dev starts three kinds of processes, and each gets an environment built
here from an explicit allow-list, never the whole of the caller's:

* the tmux server and the controller's window (:func:`controller_environment`),
* every agent and its hooks (:func:`agent_environment`),
* commands that run code agents wrote (verify): :func:`public_env`, no secrets.

What counts as a secret is decided once, by :func:`is_secret_name`, for both
environments and log fields: secrets never travel in argv (``tmux -e`` is
visible in ``ps``), never reach a log line, and reach a process only through
a 0600 file that the pane's launcher reads and deletes.

Everything here is pure (mappings in, dicts out): the callers pass the PATH
they computed and the environment they start from.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_SECRET_WORDS = re.compile(
    r"(?:^|_)(?:KEY|APIKEY|TOKEN|SECRET|PASSWORD|PASSWD|AUTH|AUTHORIZATION|CREDENTIALS?|"
    r"COOKIE)(?:$|_)",
    re.IGNORECASE,
)


def is_secret_name(name: str) -> bool:
    """True for a variable or log field that may hold a secret (``LINEAR_API_KEY``,
    ``GH_TOKEN``, ``api_key``, ``authorization``…): judged by its words."""
    return bool(_SECRET_WORDS.search(name.replace("-", "_")))


def public_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without secrets: what may appear on a command line or reach code an
    agent wrote (verify commands)."""
    return {k: v for k, v in env.items() if not is_secret_name(k)}


def split_secrets(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(public, secret) halves of ``env``: the public half may be shown, the secret
    half travels only through a 0600 file."""
    secrets = {k: v for k, v in env.items() if is_secret_name(k)}
    return public_env(env), secrets


# --- the controller window and the tmux server ---------------------------------------

NETWORK = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
           "SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE")
"""How this machine reaches the network (proxies, a company's CA): every process that
talks to an API needs them, and none is a secret by itself."""

_CONTROLLER_EXACT = (
    "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TERM", "SHELL", "TMPDIR", "TZ",
    "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR",
    "SSH_AUTH_SOCK", *NETWORK,
)
# GH_/GITHUB_: pull-request mode's gh and push; the controller is ralph-dev itself.
# OPENAI_, GEMINI_, GOOGLE_GEMINI_: what Codex and Gemini CLI workers are to get (each
# worker gets only its own CLI's, launch.py).
_CONTROLLER_PREFIXES = ("RALPH_DEV_", "ANTHROPIC_", "CLAUDE_", "LINEAR_", "JJ_", "DISABLE_",
                        "GH_", "GITHUB_", "OPENAI_", "GEMINI_", "GOOGLE_GEMINI_")


WEB_TOKEN = "RALPH_DEV_WEB_TOKEN"  # noqa: S105 - a variable name, not a secret
"""The dashboard's access token: the daemon's alone. Neither the controller nor anything
it starts needs it, and a worker holding it could read every issue and pane."""


def controller_environment(environ: Mapping[str, str], *, path: str, config_file: str,
                           pass_env: tuple[str, ...] = ()) -> dict[str, str]:
    """What the controller window needs (it talks to the tracker and starts agents, so
    it carries what they are to get: ``agent.pass_env``)."""
    env = {k: v for k, v in environ.items() if k != WEB_TOKEN and (
        k in _CONTROLLER_EXACT or k in pass_env or k.startswith(_CONTROLLER_PREFIXES))}
    env["PATH"] = path
    env.setdefault("RALPH_DEV_CONFIG", config_file)
    return env


# --- agents ---------------------------------------------------------------------------

AGENT_FLAGS = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
}
"""Set for every agent: no network traffic beyond the model API, no self-update."""

# Not TERM: the pane's terminal is tmux's, whatever terminal ralph-dev itself runs in.
_AGENT_EXACT = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "SHELL",
                "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME",
                "TMPDIR", "CLAUDE_CONFIG_DIR", *NETWORK)
# CLAUDE_CODE_: how Claude Code reaches its model (a subscriber's CLAUDE_CODE_OAUTH_TOKEN,
# CLAUDE_CODE_USE_BEDROCK…), minus what a session sets for its own children.
_AGENT_PREFIXES = ("RALPH_DEV_", "JJ_")
CLAUDE_PREFIXES = ("ANTHROPIC_", "CLAUDE_CODE_")
"""How Claude Code reaches its model: its profile's ``env_prefixes``, and what the
command runner and the supervisor get."""
CONTROLLER_SECRETS = ("LINEAR_API_KEY", "RALPH_DEV_LINEAR_WEBHOOK_SECRET", WEB_TOKEN)
"""The tracker's key, the webhook's secret and the dashboard's token. Only the
controller and the daemon use them: worker commands and hooks never call the tracker
(the controller relays every write), so a worker holding one could only write to other
issues as the swarm's own user."""


def controller_secret(name: str) -> bool:
    """True for a secret no agent, hook or verify run may hold, whatever
    ``agent.pass_env`` says: the named ones, and any secret of ralph-dev's or Linear's."""
    return name in CONTROLLER_SECRETS or (
        name.startswith(("RALPH_DEV_", "LINEAR_")) and is_secret_name(name))


def tracker_key(environ: Mapping[str, str]) -> dict[str, str]:
    """The tracker's key, for the one agent that works as a person would: the
    supervisor, unconfined, repairs through people's commands (``issue comment``…)."""
    return {name: environ[name] for name in ("LINEAR_API_KEY",) if name in environ}


WORKER_IDENTITY = ("RALPH_DEV_ISSUE", "RALPH_DEV_ROLE", "RALPH_DEV_WORKSPACE",
                   "RALPH_DEV_ATTEMPT")
"""Variables that say which worker a process is: set per worker, never inherited."""

RUN_DIR_VAR = "RALPH_DEV_RUN_DIR"
"""Where an UNconfined worker (``agent.sandbox = "off"``) finds its run directory."""


ATTEMPT_VAR = "RALPH_DEV_ATTEMPT"
"""Which attempt a window runs, in the environment the controller opens it with: the
worker's identity on its host (a cluster names the attempt's actor and pushes by it).
An attempt counts every start of the issue's worker, charged or not
(``WorkerRecord.host_attempt``): a restart for a lost host charges nothing, yet it must
never share a name with the attempt it replaces."""

OWN_VARIABLES = frozenset({
    # who a worker is and where its things are (set for workers, hooks and panes)
    "RALPH_DEV_PROJECT", *WORKER_IDENTITY, RUN_DIR_VAR, "RALPH_DEV_REPO", ATTEMPT_VAR,
    # read by the command line, the daemon and the adapters
    "RALPH_DEV_CONFIG", "RALPH_DEV_LOG_LEVEL", "RALPH_DEV_JJ", WEB_TOKEN,
    "RALPH_DEV_LINEAR_URL", "RALPH_DEV_LINEAR_WEBHOOK_SECRET",
    # the set-up scripts and the tests
    "RALPH_DEV_CLAUDE_BIN", "RALPH_DEV_CODEX_BIN", "RALPH_DEV_GEMINI_BIN",
    "RALPH_DEV_LINEAR_SCHEMA", "RALPH_DEV_CHAOS_SEED", "RALPH_DEV_CAMPAIGN_SEED",
    "RALPH_DEV_SHARED", "RALPH_DEV_WITH_CLAUDE", "RALPH_DEV_WITH_CODEX",
    "RALPH_DEV_WITH_GEMINI",
})
"""``RALPH_DEV_*`` variables that are no setting: ralph-dev sets them for its own
processes or reads them elsewhere. Any other is a setting (``core.config``), or a
mistake said as one."""
OWN_PREFIXES = ("RALPH_DEV_DEMO_", "RALPH_DEV_TEST_", "RALPH_DEV_COMPAT")
"""The demo agent's, the test suite's and ``scripts/compat.sh``'s own variables."""


def worker_identity(*, issue: str, role: str, workspace: str, attempt: int) -> dict[str, str]:
    """The :data:`WORKER_IDENTITY` variables of one worker (its agent's, and its verify's)."""
    return {"RALPH_DEV_ISSUE": issue, "RALPH_DEV_ROLE": role, "RALPH_DEV_WORKSPACE": workspace,
            "RALPH_DEV_ATTEMPT": str(int(attempt))}

NESTED_CLAUDE_VARS = (
    "CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT", "CLAUDE_CODE_SSE_PORT", "CLAUDE_CODE_CHILD_SESSION",
    "CLAUDE_CODE_SESSION_ID", "CLAUDE_ENV_FILE", "CLAUDE_PROJECT_DIR", "CLAUDE_PLUGIN_ROOT",
    "CLAUDE_PLUGIN_DATA", "AI_AGENT",
)
"""Set by a Claude Code session for its own children (seen in a hook's environment).
A person who runs `ralph-dev start` from inside Claude Code starts the tmux server with
them, and every worker's claude would then believe it is nested in that session: the
pane's launcher removes them."""


def agent_environment(environ: Mapping[str, str], *, project: str, home: str, path: str,
                      config_file: str | None, isolated_home: bool,
                      pass_env: tuple[str, ...] = (),
                      provider: tuple[str, ...] = CLAUDE_PREFIXES) -> dict[str, str]:
    """What every agent process of the project gets, and all it gets: the pane's
    launcher starts from this, not from the tmux server's environment. ``provider``:
    the prefixes of its CLI's own variables (its key, its endpoint); another
    provider's never pass."""
    env: dict[str, str] = {}
    for name, value in environ.items():
        if name in WORKER_IDENTITY or controller_secret(name) or name in NESTED_CLAUDE_VARS:
            continue
        if name in _AGENT_EXACT or name in pass_env or name.startswith(_AGENT_PREFIXES) \
                or name.startswith(provider):
            env[name] = value
    if isolated_home:
        env.pop("CLAUDE_CONFIG_DIR", None)
    env.update(AGENT_FLAGS)
    env.update({"PATH": path, "HOME": home, "RALPH_DEV_PROJECT": project})
    if config_file is not None:
        env["RALPH_DEV_CONFIG"] = config_file
    return env


# --- verify commands --------------------------------------------------------------------


def verify_environment(base: Mapping[str, str], *, project: str,
                       identity: Mapping[str, str] | None) -> dict[str, str]:
    """What the verify command gets, the same wherever it runs: at ``worker done`` (inside
    the worker, ``base`` its agent's environment) and when the controller verifies the
    change on top of trunk (``base`` rebuilt as that agent's). A verify that passed at
    ``worker done`` must not fail at the merge for a missing variable.

    No secrets (it runs code agents wrote), not the worker's channel, not what a Claude
    Code session sets for its own children; the worker's identity from ralph-dev's own
    record of it (``identity``, :func:`worker_identity`), never from ``base``. Trunk's own
    verify belongs to no worker: ``identity`` None leaves those variables unset."""
    env = {k: v for k, v in public_env(base).items()
           if k not in WORKER_IDENTITY and k != RUN_DIR_VAR and k not in NESTED_CLAUDE_VARS}
    env["RALPH_DEV_PROJECT"] = project
    env["TERM"] = "dumb"  # its output goes to a log at both sites, never to a terminal
    env.update(identity or {})
    return env
