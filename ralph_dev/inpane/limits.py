"""Reading an API key's rate limit after Claude Code gave up on a 429.

Claude Code 2.1.197 gives up at once on a 429 whose ``retry-after`` is over a minute,
and passes the header on nowhere: not in the ``StopFailure`` payload, the transcript
or its debug log (docs/claude-code-limits.md). The StopFailure hook therefore asks the
API once itself, with the agent's own key and base URL, for the smallest answer there
is, and reads the reset from the refusal. A refused request costs nothing; when the
limit has lifted meanwhile the answer is one token. Nothing is asked without a key of
its own to ask with (a subscriber's limit states its reset in its text) or without
the model the agent used (limits are per model, so another model's answer would be
a guess).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from ralph_dev.core.agent_faults import reset_from_headers

PROBE_TIMEOUT = 10.0
"""Seconds the probe may take: the hook sits in the agent's path (its timeout is 30)."""
API_VERSION = "2023-06-01"
_ELSEWHERE = ("CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY")
"""A cloud provider's limits are not the Anthropic API's: nothing to ask there."""


def model_used(transcript: Path | None) -> str | None:
    """The model of the agent's last real answer in its transcript (a refused call's
    entry is Claude Code's own, ``<synthetic>``)."""
    if transcript is None:
        return None
    try:
        lines = transcript.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
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


def read_reset(env: Mapping[str, str], model: str | None, now: datetime, *,
               timeout: float = PROBE_TIMEOUT) -> datetime | None:
    """When the API key's limit lifts, as the API says to one small request; ``now`` when
    it has lifted already; None when it cannot be asked or does not say."""
    key = env.get("ANTHROPIC_API_KEY")
    if not key or not model or any(env.get(flag) for flag in _ELSEWHERE):
        return None
    base = (env.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com").rstrip("/")
    if not base.startswith(("https://", "http://")):
        return None
    body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "."}]}
    request = urllib.request.Request(  # noqa: S310 (an http(s) URL: checked above)
        f"{base}/v1/messages", data=json.dumps(body).encode(), method="POST",
        headers={"x-api-key": key, "anthropic-version": API_VERSION,
                 "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout):  # noqa: S310
            return now
    except urllib.error.HTTPError as refused:
        return reset_from_headers(dict(refused.headers.items()), now) \
            if refused.code == 429 else None
    except (OSError, ValueError):
        return None
