"""Prometheus metrics for a swarm, served by the daemon at ``GET /metrics``.

The controller and the daemon are separate processes (the controller runs in
its own tmux window and is restarted at will), so no in-memory counter in either
would survive or be visible to the other. Instead:

* **counters** are derived from the events log, which every process already
  appends to and which outlives them all: the daemon reads it once from the
  start and then incrementally by offset (:meth:`EventCounts.consume`), so a
  counter is the true total since the project began, even across daemon
  restarts. A log that was replaced reads as a counter reset, which Prometheus
  handles;
* **gauges** come from the state document (workers, issues, health, tracker);
* the **tick duration histogram** is kept by the controller itself
  (:class:`TickHistogram`, cumulative bucket counts since it started) and
  published in its heartbeat; a controller restart is a counter reset.

prometheus_client's multiprocess mode was the alternative; it needs a shared
directory of mmap files per process and cleanup of dead pids, for what the
events log already records durably.

``prometheus_client`` is imported only by :func:`render_metrics`, so the
controller, which keeps a :class:`TickHistogram`, never loads it.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from ralph_dev.core.agent_faults import USAGE_LIMIT
from ralph_dev.core.model import Role

TICK_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Upper bounds (seconds) of the tick histogram; +Inf is implied."""

USAGE_EVENT = "agent_usage"
"""Event a worker's supervision writes when it learns what an agent used: ``role``,
``input_tokens``, ``output_tokens``, ``cache_read_tokens``, ``cache_write_tokens``,
``cost_usd`` (each optional). The token and cost counters sum these."""

PAUSE_EVENT = "swarm_paused"
"""Event written when a cause outside any issue pauses the swarm; ``kind`` names it
(``usage-limit``, ``api-outage``, ``setup``…)."""

TOKEN_KINDS = ("input", "output", "cache_read", "cache_write")

FAILURE_KINDS = {
    "action_failed": "action_failed",
    "reap": "worker_died",
    "verify_failed": "verify_failed",
    "merge_conflict": "merge_conflict",
    "tick_failed": "tick_failed",
}
"""Event → ``kind`` label of ``ralph_dev_failures_total``."""

HOLD_KINDS = {"hold": "attempt_cap", "worker_blocked": "question"}
"""Event → ``kind`` label of ``ralph_dev_holds_total``."""

COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "spawns": ("Workers started, by role and kind (spawn, or restart of a stuck one)",
               ("role", "kind")),
    "merges": ("Changes merged into trunk (or pushed for a pull request)", ()),
    "failures": ("Failures by kind: " + ", ".join(sorted(set(FAILURE_KINDS.values()))),
                 ("kind",)),
    "holds": ("Issues put before a person: attempt cap reached, or a worker's question",
              ("kind",)),
    "usage_limit_pauses": ("Times the swarm paused on an agent usage limit", ()),
    "tokens": ("Agent tokens used, by role and kind (when the agent reports them)",
               ("role", "kind")),
    "cost_usd": ("Agent cost in US dollars, by role (when the agent reports it)", ("role",)),
    "events": ("Events written to the events log, by event name", ("event",)),
    "egress_refused": ("Connections a worker's egress proxy refused, by issue "
                       "(agent.network = \"allowlist\")", ("issue",)),
    "egress_bytes": ("Bytes a worker sent (out) and received (in) through its egress proxy, "
                     "by issue", ("issue", "direction")),
}


class TickHistogram:
    """Cumulative tick durations, kept by the controller, published in its heartbeat."""

    def __init__(self, buckets: tuple[float, ...] = TICK_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.total += seconds

    def as_json(self) -> dict[str, Any]:
        return {"buckets": list(self.buckets), "counts": list(self.counts),
                "sum": round(self.total, 6)}


LabelSet = tuple[tuple[str, str], ...]


class EventCounts:
    """Counter values derived from the events log, fed one event at a time."""

    def __init__(self) -> None:
        self.values = _zero_counts()

    def reset(self) -> None:
        """The log was replaced: start over (Prometheus reads it as a counter reset)."""
        self.values = _zero_counts()

    def _add(self, name: str, amount: float = 1.0, **labels: str) -> None:
        self.values[(name, tuple(sorted(labels.items())))] += amount

    def consume(self, event: Mapping[str, Any]) -> None:
        name = str(event.get("event", ""))
        self._add("events", event=name[:60])
        role = str(event.get("role") or "unknown")
        if name in ("spawn", "restart"):
            self._add("spawns", role=role, kind=name)
        elif name == "merge":
            self._add("merges")
        elif name in FAILURE_KINDS:
            self._add("failures", kind=FAILURE_KINDS[name])
        elif name in HOLD_KINDS and not event.get("repeated"):
            self._add("holds", kind=HOLD_KINDS[name])
        elif name == PAUSE_EVENT and event.get("kind") == USAGE_LIMIT:
            self._add("usage_limit_pauses")
        elif name == "egress_refused":
            self._add("egress_refused", issue=str(event.get("issue", ""))[:40])
        elif name == "egress_bytes":
            for direction in ("out", "in"):
                amount = _number(event.get(f"{direction}_bytes"))
                if amount:
                    self._add("egress_bytes", amount, issue=str(event.get("issue", ""))[:40],
                              direction=direction)
        elif name == USAGE_EVENT:
            for kind in TOKEN_KINDS:
                amount = _number(event.get(f"{kind}_tokens"))
                if amount:
                    self._add("tokens", amount, role=role, kind=kind)
            cost = _number(event.get("cost_usd"))
            if cost:
                self._add("cost_usd", cost, role=role)


def _zero_counts() -> defaultdict[tuple[str, LabelSet], float]:
    """Every fixed series at 0, so ``rate()`` works before the first event of its kind."""
    values: defaultdict[tuple[str, LabelSet], float] = defaultdict(float)
    for role in Role:
        for kind in ("spawn", "restart"):
            values[("spawns", (("kind", kind), ("role", role.value)))] = 0
    for kind in {*FAILURE_KINDS.values()}:
        values[("failures", (("kind", kind),))] = 0
    for kind in HOLD_KINDS.values():
        values[("holds", (("kind", kind),))] = 0
    values[("merges", ())] = 0
    values[("usage_limit_pauses", ())] = 0
    return values


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        and value > 0 else 0.0


def render_metrics(counts: EventCounts, document: Mapping[str, Any],
                   tick_histogram: Mapping[str, Any] | None) -> bytes:
    """The Prometheus text exposition of everything above."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(lambda: _families(counts, document, tick_histogram)))
    exposition: bytes = generate_latest(registry)
    return exposition


class _Collector:
    def __init__(self, build: Callable[[], Iterable[Any]]) -> None:
        self.build = build

    def collect(self) -> Iterable[Any]:
        return self.build()


def _families(counts: EventCounts, doc: Mapping[str, Any],
              tick_histogram: Mapping[str, Any] | None) -> Iterable[Any]:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    for name, (text, label_names) in COUNTERS.items():
        family = CounterMetricFamily(f"ralph_dev_{name}", text, labels=label_names)
        for (metric, labels), value in sorted(counts.values.items()):
            if metric == name:
                named = dict(labels)
                family.add_metric([named.get(n, "") for n in label_names], value)
        yield family

    workers = GaugeMetricFamily("ralph_dev_workers", "Worker windows by role and state",
                                labels=("role", "state"))
    by_role_state = Counter((w.get("role") or "unknown", w.get("state") or "unknown")
                            for w in doc.get("workers", ()))
    for (role, state), value in sorted(by_role_state.items()):
        workers.add_metric([role, state], value)
    yield workers

    if doc.get("cluster") is not None:
        on_hosts = GaugeMetricFamily("ralph_dev_cluster_workers",
                                     "Workers on a cluster, by host and Ray node id",
                                     labels=("host", "node"))
        by_node = Counter((w.get("host") or "", w.get("node") or "")
                          for w in doc.get("workers", ()) if w.get("node"))
        for (host_name, node), value in sorted(by_node.items()):
            on_hosts.add_metric([host_name, node], value)
        yield on_hosts
        free = doc["cluster"].get("free_slots")
        if free is not None:
            yield GaugeMetricFamily("ralph_dev_cluster_free_slots",
                                    "Free ralph_worker slots on the cluster's hosts", value=free)

    if (account := doc.get("account")) is not None:
        used = GaugeMetricFamily("ralph_dev_account_window_used_ratio",
                                 "Share of the account's usage window used, as the model API "
                                 "last stated it", labels=("account", "window"))
        left = GaugeMetricFamily("ralph_dev_account_window_reset_seconds",
                                 "Seconds until the account's usage window starts over",
                                 labels=("account", "window"))
        generated = datetime.fromisoformat(doc["generated_at"])
        for window in account["windows"]:
            window_labels = [account["name"], window["name"]]
            used.add_metric(window_labels, window["used"])
            reset = datetime.fromisoformat(window["resets_at"])
            left.add_metric(window_labels, max(0.0, (reset - generated).total_seconds()))
        pacing = GaugeMetricFamily("ralph_dev_account_pacing",
                                   "1 while the account's usage windows hold new workers back",
                                   labels=("account",))
        pacing.add_metric([account["name"]], 1.0 if account.get("pacing") else 0.0)
        yield from (used, left, pacing)

    issues = GaugeMetricFamily("ralph_dev_issues", "Issues by board column", labels=("state",))
    for state, value in sorted((doc.get("issues") or {}).items()):
        if state != "total":
            issues.add_metric([state], value)
    yield issues

    live_tokens = GaugeMetricFamily(
        "ralph_dev_worker_tokens", "Tokens used by the live workers, by role and kind "
        "(when their agent reports them)", labels=("role", "kind"))
    sums: defaultdict[tuple[str, str], float] = defaultdict(float)
    for worker in doc.get("workers", ()):
        for kind, value in (worker.get("tokens") or {}).items():
            sums[(worker.get("role") or "unknown", kind)] += _number(value)
    for (role, kind), value in sorted(sums.items()):
        live_tokens.add_metric([role, kind], value)
    yield live_tokens

    controller = doc.get("controller") or {}
    yield GaugeMetricFamily("ralph_dev_controller_up",
                            "1 while the controller's heartbeat is fresh",
                            value=1.0 if controller.get("healthy") else 0.0)
    age = controller.get("heartbeat_age_s")
    if age is not None:
        yield GaugeMetricFamily("ralph_dev_heartbeat_age_seconds",
                                "Age of the controller's last heartbeat", value=age)
    trunk = doc.get("trunk") or {}
    yield GaugeMetricFamily("ralph_dev_trunk_red", "1 while trunk's verify command fails",
                            value=1.0 if trunk.get("colour") == "red" else 0.0)
    usage = (doc.get("tracker") or {}).get("usage") or {}
    for key, text in (("requests_this_hour", "Tracker requests this hour (the controller's)"),
                      ("complexity_this_hour", "Tracker complexity points this hour")):
        value = _number(usage.get(key))
        yield GaugeMetricFamily(f"ralph_dev_tracker_{key}", text, value=value)

    if tick_histogram:
        buckets = list(tick_histogram.get("buckets") or ())
        counts_in = list(tick_histogram.get("counts") or ())
        if len(counts_in) == len(buckets) + 1:
            cumulative, running = [], 0
            for bound, count in zip([*map(str, buckets), "+Inf"], counts_in, strict=True):
                running += int(count)
                cumulative.append((bound, running))
            yield HistogramMetricFamily(
                "ralph_dev_tick_duration_seconds", "Controller tick duration "
                "(since the controller last started)",
                buckets=cumulative, sum_value=float(tick_histogram.get("sum") or 0.0))
