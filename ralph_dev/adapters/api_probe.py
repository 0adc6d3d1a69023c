"""Asking a model API once, with an agent's own key, what the key's limits are.

Claude Code passes an API key's rate-limit headers on nowhere (docs/claude-code-limits.md):
not to its hooks, its status line, its transcript or its debug log; Codex keeps only a
ChatGPT plan's windows (``x-codex-*``), not an OpenAI key's ``x-ratelimit-*``. The one way
to read them is to ask the API: the smallest request there is, with the key and base URL
the agents use, and the model they use (limits are per model). The answer's headers
state each per-minute limit (``core.agent_faults``); a refusal's state its reset. A
refused request costs nothing.

Two askers use it: the StopFailure hook in a Claude Code worker's pane, after it gave up
on a 429 (``inpane.limits``), and the controller, at most once a minute per account
while issues wait to start, so that pacing (``core.pacing``) sees an API key's use as
it sees a subscriber's (``adapters.accounts.KeyProbe``).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import structlog

from ralph_dev.adapters.files import read_tail
from ralph_dev.core.agent_faults import key_windows, openai_key_windows

log = structlog.get_logger(__name__)

PROBE_TIMEOUT = 10.0
"""Seconds a probe may take: the hook sits in the agent's path (its timeout is 30)."""
API_VERSION = "2023-06-01"
KEY_VARIABLE = "ANTHROPIC_API_KEY"
_ELSEWHERE = ("CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY")
"""A cloud provider's limits are not the Anthropic API's: nothing to ask there."""


@dataclass(frozen=True)
class Answer:
    """The API's answer to a probe: its status and headers (names in lower case)."""

    status: int
    headers: Mapping[str, str]


OPENAI_KEY_VARIABLE = "OPENAI_API_KEY"


def can_ask(env: Mapping[str, str]) -> bool:
    """Whether ``env`` gives an agent an API key of the Anthropic API itself (a
    subscriber's login, or a cloud provider's endpoint, has no such limits to ask)."""
    base = env.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"
    return bool(env.get(KEY_VARIABLE)) and not any(env.get(flag) for flag in _ELSEWHERE) \
        and base.startswith(("https://", "http://"))


def can_ask_openai(env: Mapping[str, str]) -> bool:
    """Whether ``env`` gives Codex an OpenAI API key (a ChatGPT plan's login has windows
    Codex reads itself)."""
    base = env.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
    return bool(env.get(OPENAI_KEY_VARIABLE)) and base.startswith(("https://", "http://"))


def ask(env: Mapping[str, str], model: str, *, timeout: float = PROBE_TIMEOUT
        ) -> Answer | None:
    """One request of one output token with ``env``'s Anthropic key; None when it cannot
    be asked or nothing answered (the key never leaves the request's header)."""
    if not can_ask(env) or not model:
        return None
    base = (env.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com").rstrip("/")
    body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "."}]}
    return _post(f"{base}/v1/messages", body, {
        "x-api-key": env[KEY_VARIABLE], "anthropic-version": API_VERSION}, timeout)


def ask_openai(env: Mapping[str, str], model: str, *, timeout: float = PROBE_TIMEOUT
               ) -> Answer | None:
    """The same of the OpenAI Responses API (16 output tokens, its least), with ``env``'s
    OpenAI key; only its headers are read."""
    if not can_ask_openai(env) or not model:
        return None
    base = (env.get("OPENAI_BASE_URL") or "https://api.openai.com/v1").rstrip("/")
    body = {"model": model, "input": ".", "max_output_tokens": 16, "store": False}
    return _post(f"{base}/responses", body,
                 {"authorization": f"Bearer {env[OPENAI_KEY_VARIABLE]}"}, timeout)


def _post(url: str, body: Mapping[str, object], headers: Mapping[str, str],
          timeout: float) -> Answer | None:
    """POST ``body``; the answer's status and headers (its body is never read)."""
    request = urllib.request.Request(  # noqa: S310 (an http(s) URL: checked by the caller)
        url, data=json.dumps(body).encode(), method="POST",
        headers={**headers, "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310
            return Answer(answer.status, {k.lower(): v for k, v in answer.headers.items()})
    except urllib.error.HTTPError as refused:
        return Answer(refused.code, {k.lower(): v for k, v in refused.headers.items()})
    except (OSError, ValueError):
        return None


TRANSCRIPT_TAIL = 2**20
"""Bytes of a transcript's end looked through for the model (its last answers)."""


def model_used(transcript: Path | None) -> str | None:
    """The model of the agent's last real answer in its transcript (a refused call's
    entry is Claude Code's own, ``<synthetic>``)."""
    if transcript is None:
        return None
    tail, _ = read_tail(transcript, limit=TRANSCRIPT_TAIL)
    for line in reversed(tail.decode(errors="replace").splitlines()):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        message = entry.get("message") if isinstance(entry, dict) else None
        model = message.get("model") if isinstance(message, dict) else None
        if entry.get("type") == "assistant" and isinstance(model, str) \
                and model and not model.startswith("<"):
            return model
    return None


@dataclass(frozen=True)
class KeyReading:
    """What one probe of the controller read: the model asked for, the API's status,
    and the key's per-minute limits (name: used share, when full again)."""

    model: str
    status: int
    windows: Mapping[str, tuple[float, datetime]]


def can_probe(cli: str, env: Mapping[str, str]) -> bool:
    """Whether agents of ``cli`` run on an API key whose limits can be asked for."""
    return can_ask(env) if cli == "claude" else can_ask_openai(env) if cli == "codex" \
        else False


def read_key_windows(cli: str, env: Mapping[str, str], model: str, now: datetime, *,
                     timeout: float = PROBE_TIMEOUT) -> KeyReading | None:
    """Ask ``cli``'s API once, for ``model``, and read the key's limits from the answer;
    None when nothing answered."""
    answer = (ask if cli == "claude" else ask_openai)(env, model, timeout=timeout)
    if answer is None:
        log.info("key_probe_unanswered", model=model, cli=cli)
        return None
    windows = key_windows(answer.headers) if cli == "claude" \
        else openai_key_windows(answer.headers, now)
    return KeyReading(model, answer.status, windows)
