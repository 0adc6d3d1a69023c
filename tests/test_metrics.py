"""Metrics from the events log and the state document, as Prometheus' own parser reads
them: every family present from the start (0 until its first event), counters that
only grow, tokens and cost when agents report them, a replaced log read as a reset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ralph_dev.adapters.store import StateStore
from ralph_dev.control.daemon.metrics import EventCounts, TickHistogram, render_metrics
from ralph_dev.core.config import ProjectPaths

DOCUMENT: dict[str, Any] = {
    "workers": [
        {"role": "execute", "state": "running", "tokens": {"input": 100, "output": 20}},
        {"role": "execute", "state": "running", "tokens": None},
        {"role": "plan", "state": "done", "tokens": None},
    ],
    "issues": {"held": 1, "ready": 2, "running": 2, "blocked": 0, "waiting": 0, "done": 3,
               "total": 8},
    "controller": {"healthy": True, "heartbeat_age_s": 1.5},
    "trunk": {"colour": "red"},
    "tracker": {"usage": {"requests_this_hour": 42, "complexity_this_hour": 900}},
}


def _parse(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_every_family_is_there_before_any_event() -> None:
    values = _parse(render_metrics(EventCounts(), DOCUMENT, None))
    assert values[("ralph_dev_usage_limit_pauses_total", ())] == 0
    assert values[("ralph_dev_merges_total", ())] == 0
    assert values[("ralph_dev_failures_total", (("kind", "worker_died"),))] == 0
    assert values[("ralph_dev_spawns_total", (("kind", "spawn"), ("role", "review")))] == 0
    assert values[("ralph_dev_workers", (("role", "execute"), ("state", "running")))] == 2
    assert values[("ralph_dev_issues", (("state", "held"),))] == 1
    assert values[("ralph_dev_worker_tokens", (("kind", "input"), ("role", "execute")))] == 100
    assert values[("ralph_dev_trunk_red", ())] == 1
    assert values[("ralph_dev_controller_up", ())] == 1
    assert values[("ralph_dev_tracker_requests_this_hour", ())] == 42


def test_a_cluster_shows_its_workers_by_host_and_its_free_slots() -> None:
    workers = [{"role": "execute", "state": "running", "tokens": None, "host": h, "node": n}
               for h, n in (("h1", "n1"), ("h1", "n1"), ("h2", "n2"))]
    values = _parse(render_metrics(EventCounts(), {**DOCUMENT, "workers": workers,
                                                   "cluster": {"free_slots": 1}}, None))
    assert values[("ralph_dev_cluster_workers", (("host", "h1"), ("node", "n1")))] == 2
    assert values[("ralph_dev_cluster_workers", (("host", "h2"), ("node", "n2")))] == 1
    assert values[("ralph_dev_cluster_free_slots", ())] == 1
    # one host: no cluster families at all
    assert not [k for k in _parse(render_metrics(EventCounts(), DOCUMENT, None))
                if k[0].startswith("ralph_dev_cluster")]


def test_the_accounts_windows_and_pacing_are_gauges() -> None:
    """Issue 36: each usage window's use and time to reset, and whether they hold new
    workers back."""
    account = {"name": "claude-0123", "reserve": 0.2, "windows": [
        {"name": "five_hour", "used": 0.85, "resets_at": "2026-11-27T15:00:00+00:00",
         "seen_at": "2026-11-27T12:00:00+00:00"},
        {"name": "seven_day", "used": 0.3, "resets_at": "2026-11-30T12:00:00+00:00",
         "seen_at": "2026-11-27T12:00:00+00:00"}],
        "pacing": {"window": "five_hour", "why": "spent", "until": "2026-11-27T15:00:00+00:00"}}
    values = _parse(render_metrics(EventCounts(), {
        **DOCUMENT, "generated_at": "2026-11-27T14:00:00+00:00", "account": account}, None))
    five = (("account", "claude-0123"), ("window", "five_hour"))
    assert values[("ralph_dev_account_window_used_ratio", five)] == 0.85
    assert values[("ralph_dev_account_window_reset_seconds", five)] == 3600
    assert values[("ralph_dev_account_pacing", (("account", "claude-0123"),))] == 1
    assert not [k for k in _parse(render_metrics(EventCounts(), DOCUMENT, None))
                if k[0].startswith("ralph_dev_account")]


def test_counters_follow_the_events(xdg: Path) -> None:
    store = StateStore(ProjectPaths("demo"))
    for event, details in (
        ("spawn", {"issue": "DEMO-1", "role": "execute"}),
        ("restart", {"issue": "DEMO-1", "role": "execute"}),
        ("reap", {"issue": "DEMO-2"}),
        ("merge", {"issue": "DEMO-1"}),
        ("worker_blocked", {"issue": "DEMO-3", "repeated": False}),
        ("worker_blocked", {"issue": "DEMO-3", "repeated": True}),  # the same question again
        ("hold", {"issue": "DEMO-4"}),
        ("swarm_paused", {"kind": "usage-limit", "cause": "the model's usage limit was "
                                                          "reached: resets 3pm"}),
        ("swarm_paused", {"kind": "api-outage", "cause": "the model API failed"}),
        ("swarm_paused", {"cause": "setup_error"}),
        ("agent_usage", {"role": "plan", "input_tokens": 1000, "output_tokens": 50,
                         "cost_usd": 0.25}),
        ("agent_usage", {"role": "plan", "input_tokens": "lots", "cost_usd": True}),  # junk
    ):
        store.append_event(event, **details)
    counts = EventCounts()
    events, _ = store.read_events_from(0)
    for event in events:
        counts.consume(event)
    histogram = TickHistogram()
    for seconds in (0.02, 0.02, 0.3, 700):
        histogram.observe(seconds)
    values = _parse(render_metrics(counts, DOCUMENT, histogram.as_json()))
    assert values[("ralph_dev_spawns_total", (("kind", "spawn"), ("role", "execute")))] == 1
    assert values[("ralph_dev_spawns_total", (("kind", "restart"), ("role", "execute")))] == 1
    assert values[("ralph_dev_failures_total", (("kind", "worker_died"),))] == 1
    assert values[("ralph_dev_merges_total", ())] == 1
    assert values[("ralph_dev_holds_total", (("kind", "question"),))] == 1
    assert values[("ralph_dev_holds_total", (("kind", "attempt_cap"),))] == 1
    assert values[("ralph_dev_usage_limit_pauses_total", ())] == 1
    assert values[("ralph_dev_tokens_total", (("kind", "input"), ("role", "plan")))] == 1000
    assert values[("ralph_dev_cost_usd_total", (("role", "plan"),))] == 0.25
    assert values[("ralph_dev_events_total", (("event", "worker_blocked"),))] == 2
    assert values[("ralph_dev_tick_duration_seconds_bucket", (("le", "0.025"),))] == 2
    assert values[("ralph_dev_tick_duration_seconds_bucket", (("le", "300.0"),))] == 3
    assert values[("ralph_dev_tick_duration_seconds_bucket", (("le", "+Inf"),))] == 4
    assert values[("ralph_dev_tick_duration_seconds_count", ())] == 4
    counts.reset()  # what the daemon does when the log was replaced
    assert _parse(render_metrics(counts, DOCUMENT, None))[("ralph_dev_merges_total", ())] == 0
