"""The StopFailure hook reads an API key's reset from the API itself (Claude Code keeps
the ``retry-after`` of the 429 it gave up on to itself)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ralph_dev.devtools.api_faults import rate_limited, usage_limit
from ralph_dev.devtools.scripted_model import FakeAnthropic, Text
from ralph_dev.inpane.limits import model_used, read_reset

NOW = datetime(2026, 11, 23, 2, 10, 30, tzinfo=UTC)
KEY = "sk-ant-api03-fake-probe-0123456789"


def test_the_probe_reads_the_retry_after_of_the_refusal() -> None:
    with FakeAnthropic(lambda _request: [rate_limited(600)]) as api:
        env = {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": api.url}
        assert read_reset(env, "claude-sonnet-4-5", NOW) == NOW + timedelta(seconds=600)
        (asked,) = api.messages()
    assert asked["model"] == "claude-sonnet-4-5" and asked["max_tokens"] == 1


def test_the_probe_reads_a_unified_reset_and_a_lifted_limit() -> None:
    resets_at = int(NOW.timestamp()) + 3600
    with FakeAnthropic(lambda _request: [usage_limit(resets_at)]) as api:
        env = {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": api.url}
        assert read_reset(env, "m", NOW) == datetime.fromtimestamp(resets_at, UTC)
    with FakeAnthropic(lambda _request: [Text("ok")]) as api:
        env = {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": api.url}
        assert read_reset(env, "m", NOW) == NOW


def test_nothing_is_asked_without_a_key_a_model_or_with_a_cloud_provider() -> None:
    with FakeAnthropic(lambda _request: [rate_limited(600)]) as api:
        base = {"ANTHROPIC_BASE_URL": api.url}
        assert read_reset(base, "m", NOW) is None  # a subscriber: its text says the reset
        assert read_reset({**base, "ANTHROPIC_API_KEY": KEY}, None, NOW) is None
        assert read_reset({**base, "ANTHROPIC_API_KEY": KEY,
                           "CLAUDE_CODE_USE_BEDROCK": "1"}, "m", NOW) is None
        assert api.messages() == []
    assert read_reset({"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"},
                      "m", NOW, timeout=2) is None  # nobody answers: not said


def test_the_model_is_the_one_of_the_last_real_answer(tmp_path: Path) -> None:
    entries: list[dict[str, Any]] = [
        {"type": "assistant", "message": {"model": "claude-opus-4-8"}},
        {"type": "user", "message": {"content": "x"}},
        {"type": "assistant", "message": {"model": "<synthetic>"}, "error": "rate_limit"},
    ]
    transcript = tmp_path / "t.jsonl"
    transcript.write_text("\n".join(json.dumps(e) for e in entries) + "\nnot json\n")
    assert model_used(transcript) == "claude-opus-4-8"
    assert model_used(tmp_path / "missing.jsonl") is None
    assert model_used(None) is None
