"""The StopFailure hook reads an API key's reset from the API itself (Claude Code keeps
the ``retry-after`` of the 429 it gave up on to itself)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ralph_dev.adapters.api_probe import model_used
from ralph_dev.devtools.api_faults import rate_limited, usage_limit
from ralph_dev.devtools.scripted_model import FakeAnthropic, Text
from ralph_dev.inpane.limits import read_reset

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


def test_the_stop_failure_hook_asks_only_for_an_api_keys_429(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook's report carries the read reset for a key's 429; a subscriber's limit (its
    text states the reset) and an outage cost no request."""
    from types import SimpleNamespace

    from ralph_dev.adapters import mailbox
    from ralph_dev.inpane import hooks

    told: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(mailbox, "tell", lambda _dir, kind, fields: told.append((kind, fields)))
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(json.dumps({"type": "assistant", "message": {"model": "claude-x"}}))
    worker: Any = SimpleNamespace(run_dir=tmp_path)
    with FakeAnthropic(lambda _request: [rate_limited(600)]) as api:
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        for error, text in (("rate_limit", "You've hit your session limit · resets 3:06am (UTC)"),
                            ("server_error", "API Error: 529 Overloaded")):
            hooks.stop_failure(worker, {"error": error, "last_assistant_message": text,
                                        "transcript_path": str(transcript)})
        assert api.messages() == []
        before = datetime.now(UTC)
        hooks.stop_failure(worker, {
            "error": "rate_limit", "transcript_path": str(transcript),
            "last_assistant_message": "API Error: Request rejected (429) · This request would "
                                      "exceed the rate limit for your organization"})
        assert len(api.messages()) == 1
    reports = [fields for kind, fields in told if kind == "agent_error"]
    assert [("reset_at" in r) for r in reports] == [False, False, True]
    reset = datetime.fromisoformat(reports[-1]["reset_at"])
    assert before + timedelta(seconds=599) <= reset <= datetime.now(UTC) + timedelta(seconds=600)
