"""Asking the Anthropic API once, with an agent's own key, what its limits are.

Claude Code passes an API key's rate-limit headers on nowhere (docs/claude-code-limits.md):
not to its hooks, its status line, its transcript or its debug log. The one way to read
them is to ask the API: the smallest request there is (one token of output), with the
key and base URL the agents use, and the model they use (limits are per model). Its
answer's headers state each per-minute limit (``core.agent_faults.key_windows``); a
refusal's state its reset (``reset_from_headers``). A refused request costs nothing.

Two askers use it: the StopFailure hook in a worker's pane, after Claude Code gave up
on a 429 (``inpane.limits``), and the controller, at most once a minute per account
while issues wait to start, so that pacing (``core.pacing``) sees an API key's use as
it sees a subscriber's (``KeyProbe``).
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
from ralph_dev.core.agent_faults import key_windows

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


def can_ask(env: Mapping[str, str]) -> bool:
    """Whether ``env`` gives an agent an API key of the Anthropic API itself (a
    subscriber's login, or a cloud provider's endpoint, has no such limits to ask)."""
    base = env.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"
    return bool(env.get(KEY_VARIABLE)) and not any(env.get(flag) for flag in _ELSEWHERE) \
        and base.startswith(("https://", "http://"))


def ask(env: Mapping[str, str], model: str, *, timeout: float = PROBE_TIMEOUT
        ) -> Answer | None:
    """One request of one output token with ``env``'s key; None when it cannot be asked
    or nothing answered (the key never leaves the request's header)."""
    if not can_ask(env) or not model:
        return None
    base = (env.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com").rstrip("/")
    body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "."}]}
    request = urllib.request.Request(  # noqa: S310 (an http(s) URL: can_ask checked it)
        f"{base}/v1/messages", data=json.dumps(body).encode(), method="POST",
        headers={"x-api-key": env[KEY_VARIABLE], "anthropic-version": API_VERSION,
                 "content-type": "application/json"})
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


def read_key_windows(env: Mapping[str, str], model: str, *,
                     timeout: float = PROBE_TIMEOUT) -> KeyReading | None:
    """Ask once, for ``model``, and read the key's limits from the answer; None when
    nothing answered."""
    answer = ask(env, model, timeout=timeout)
    if answer is None:
        log.info("key_probe_unanswered", model=model)
        return None
    return KeyReading(model, answer.status, key_windows(answer.headers))
