"""Spend from Claude Code's transcripts (issue 13 item 5): the pure rules."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ralph_dev.adapters.store import StateStore
from ralph_dev.control.loop.costs import Spending, ledger_path
from ralph_dev.core.actions import PauseSwarm
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.costs import (
    CostSettings,
    Usage,
    over_budget,
    price_of,
    read_transcript,
    usage_of,
)
from ralph_dev.core.decide import decide
from ralph_dev.core.model import Observed


def line(message_id: str, model: str = "claude-sonnet-5", **usage: int) -> bytes:
    return json.dumps({"type": "assistant", "message": {
        "id": message_id, "role": "assistant", "model": model, "usage": usage}}).encode()


@pytest.mark.parametrize(("model", "price"), [
    ("claude-opus-4-7", (15.0, 75.0, 18.75, 1.50)),
    ("claude-sonnet-5", (3.0, 15.0, 3.75, 0.30)),
    ("Claude-Haiku-4-5", (1.0, 5.0, 1.25, 0.10)),
    ("gemini-2.5-pro", (1.25, 10.0, 0.0, 0.31)),
    ("gemini-2.5-flash", (0.30, 2.50, 0.0, 0.03)),
    ("some-other-model", (0.0, 0.0, 0.0, 0.0)),  # unknown: tokens count, dollars do not
])
def test_prices_by_model_family(model: str, price: tuple[float, ...]) -> None:
    assert price_of(model, CostSettings()) == price


def test_config_prices_come_first() -> None:
    settings = CostSettings(prices={"sonnet-5": (1.0, 2.0, 0.0, 0.0)})
    assert price_of("claude-sonnet-5", settings) == (1.0, 2.0, 0.0, 0.0)
    assert price_of("claude-sonnet-4", settings) == (3.0, 15.0, 3.75, 0.30)


def test_usage_is_priced_per_million_tokens() -> None:
    usage = usage_of({"model": "claude-sonnet-5", "usage": {
        "input_tokens": 1_000_000, "output_tokens": 100_000,
        "cache_creation_input_tokens": 0, "cache_read_input_tokens": 2_000_000}},
        CostSettings())
    assert usage.tokens == 3_100_000
    assert usage.usd == pytest.approx(3.0 + 1.5 + 0.6)


def test_a_message_split_over_lines_is_counted_once_even_across_reads() -> None:
    settings = CostSettings()
    first, last = read_transcript([
        line("msg_1", input_tokens=100, output_tokens=10),
        line("msg_1", input_tokens=100, output_tokens=10),  # its second content block
        b'{"type": "user", "message": {"role": "user", "content": "hi"}}',
        b"not json",
        line("msg_2", input_tokens=50, output_tokens=5),
    ], settings, None)
    assert (first.input, first.output) == (150, 15) and last == "msg_2"
    more, last = read_transcript([line("msg_2", input_tokens=50, output_tokens=5),
                                  line("msg_3", output_tokens=1)], settings, last)
    assert more.tokens == 1 and last == "msg_3"


def codex_line(kind: str, **payload: object) -> bytes:
    """A line of a Codex session file (``sessions/…/rollout-*.jsonl``), as 0.171 writes it."""
    return json.dumps({"timestamp": "2026-11-28T01:21:57.853Z", "type": kind,
                       "payload": payload}).encode()


def totals(input_tokens: int, cached: int, output: int) -> bytes:
    return codex_line("event_msg", type="token_count", info={
        "total_token_usage": {"input_tokens": input_tokens, "cached_input_tokens": cached,
                              "output_tokens": output, "reasoning_output_tokens": 0,
                              "total_tokens": input_tokens + output}})


def test_a_codex_session_is_counted_from_its_running_totals_each_once() -> None:
    """Codex states its session's totals, often twice for one answer: only what grew is
    counted, cached input as a cache read, at its turn's model's price, across reads."""
    settings = CostSettings()
    first, mark = read_transcript([
        codex_line("session_meta", id="01a2"),
        codex_line("turn_context", model="gpt-5-codex", cwd="/w"),
        totals(1000, 0, 100),
        totals(1000, 0, 100),  # the same answer told again
    ], settings, None)
    assert (first.input, first.output, first.cache_read) == (1000, 100, 0)
    more, mark = read_transcript([totals(2500, 500, 300)], settings, mark)
    assert (more.input, more.output, more.cache_read) == (1000, 200, 500)
    assert more.usd == pytest.approx((1000 * 1.25 + 200 * 10.0 + 500 * 0.125) / 1e6, abs=1e-6)
    again, _ = read_transcript([totals(2500, 500, 300)], settings, mark)
    assert again.tokens == 0


def gemini_line(message_id: str, **tokens: int) -> bytes:
    return json.dumps({"id": message_id, "timestamp": "2026-11-28T13:17:08.018Z",
                       "type": "gemini", "content": "ok", "model": "gemini-2.5-pro",
                       "tokens": {"thoughts": 0, "tool": 0, **tokens}}).encode()


def test_a_gemini_session_counts_each_answer_once_its_thinking_as_output() -> None:
    """Gemini CLI writes an answer's line again (same id) as its tool calls finish, and
    replays its messages in a ``$set`` line on a resume: each answer counts once; its
    prompt's cached part is a cache read, its thinking is billed as output."""
    settings = CostSettings()
    replay = json.dumps({"$set": {"messages": [{"id": "a1", "type": "gemini", "tokens": {
        "input": 999, "output": 999}}]}}).encode()
    spent, mark = read_transcript([
        json.dumps({"sessionId": "8067acc5-9767-40fe-bfa7-e9f3f10be87e"}).encode(),
        json.dumps({"id": "u1", "type": "user", "content": [{"text": "go"}]}).encode(),
        gemini_line("a1", input=1000, output=50, cached=400, thoughts=30, total=1080),
        gemini_line("a1", input=1000, output=50, cached=400, thoughts=30, total=1080),
        replay,
    ], settings, None)
    assert (spent.input, spent.output, spent.cache_read) == (600, 80, 400)
    assert spent.usd == pytest.approx((600 * 1.25 + 80 * 10.0 + 400 * 0.31) / 1e6, abs=1e-6)
    again, _ = read_transcript([gemini_line("a1", input=1000, output=50, cached=400)],
                               settings, mark)
    assert again.tokens == 0  # the same answer, read on the next pass


@pytest.mark.parametrize(("spent", "settings", "why"), [
    (Usage(usd=2.5), CostSettings(issue_usd=2.0), "costs.issue_usd"),
    (Usage(input=900, output=200), CostSettings(issue_tokens=1000), "costs.issue_tokens"),
    (Usage(input=900, usd=1.0), CostSettings(issue_usd=2.0, issue_tokens=1000), None),
    (Usage(input=10**9, usd=10**6), CostSettings(), None),  # no caps set
])
def test_over_budget_names_the_cap(spent: Usage, settings: CostSettings,
                                   why: str | None) -> None:
    found = over_budget(spent, settings)
    assert (found is None) == (why is None)
    if why:
        assert why in str(found)


def test_usage_round_trips_and_survives_garbage() -> None:
    usage = Usage(1, 2, 3, 4, 0.5)
    assert Usage.from_json(usage.as_json()) == usage
    assert Usage.from_json({"input": "x"}) == Usage()
    assert Usage.from_json(None) == Usage()


def test_a_spent_day_pauses_dispatch_until_midnight_utc(xdg: Path, tmp_path: Path) -> None:
    now = datetime(2026, 11, 23, 15, 30, tzinfo=UTC)
    settings = ProjectSettings(name="demo", repo=tmp_path)
    StateStore(settings.paths)  # the project's state dir
    ledger_path(settings).write_text(json.dumps({"days": {"2026-11-23": 12.5}}))
    over, spent_today = Spending(settings, lambda: now).account({})
    assert over == {} and spent_today == 12.5
    observed = Observed(spent_today=spent_today)
    assert not [a for a in decide(observed, settings, now).actions
                if isinstance(a, PauseSwarm)]  # no day cap set
    capped = dataclasses.replace(settings, costs=CostSettings(day_usd=10.0))
    (pause,) = [a for a in decide(observed, capped, now).actions if isinstance(a, PauseSwarm)]
    assert pause.pause_kind == "budget" and "$12.50" in pause.cause
    assert "costs.day_usd" in pause.cause
    assert pause.until == datetime(2026, 11, 24, tzinfo=UTC)
