"""Reading an API key's rate limit after Claude Code gave up on a 429.

Claude Code 2.1.197 gives up at once on a 429 whose ``retry-after`` is over a minute,
and passes the header on nowhere: not in the ``StopFailure`` payload, the transcript
or its debug log (docs/claude-code-limits.md). The StopFailure hook therefore asks the
API once itself (``adapters.api_probe``), with the agent's own key and base URL,
and reads the reset from the refusal. When the limit has lifted meanwhile the answer
is one token. Nothing is asked without a key of its own to ask with (a subscriber's
limit states its reset in its text) or without the model the agent used (limits are
per model, so another model's answer would be a guess).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from ralph_dev.adapters.api_probe import PROBE_TIMEOUT, ask
from ralph_dev.core.agent_faults import reset_from_headers


def read_reset(env: Mapping[str, str], model: str | None, now: datetime, *,
               timeout: float = PROBE_TIMEOUT) -> datetime | None:
    """When the API key's limit lifts, as the API says to one small request; ``now`` when
    it has lifted already; None when it cannot be asked or does not say."""
    answer = ask(env, model or "", timeout=timeout)
    if answer is None:
        return None
    if answer.status < 400:
        return now
    return reset_from_headers(answer.headers, now) if answer.status == 429 else None
