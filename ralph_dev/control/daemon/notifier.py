"""Telling a person when the swarm needs them: events in, few messages out.

Notifications are derived from the events log, through the table
:data:`CAUSES`: each cause names the events that raise it and those that clear
it. A cause raised again while it is open says nothing new, so there is one
message per cause until it clears; a cause that comes back within
``notify.cooldown`` of clearing (a flapping trunk, a tracker that comes and
goes) is not told again; and at most ``notify.max_per_hour`` messages go out,
the rest counted and mentioned in the next one. New causes (a usage-limit
pause, a budget breaker) are one more row in the table.

It runs in the daemon: that process is long-lived (a controller restarts far
more often), there is exactly one per project, and it already follows the
events log for the dashboard and metrics. What it has told and where it got
to in the log are kept in ``notify.json`` in the state directory, so a daemon
restart neither repeats a message nor misses an event written while it was
down; a project's first daemon starts at the end of the log instead of
announcing its history.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import structlog

from ralph_dev.adapters.files import atomic_write_text
from ralph_dev.adapters.notify import Message
from ralph_dev.adapters.store import StateStore, from_iso, utcnow
from ralph_dev.control.state.pause_text import pause_headline
from ralph_dev.core.config import NotifySettings, ProjectSettings
from ralph_dev.core.text import for_terminal, terminal_line

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Cause:
    """One reason to tell a person, which events raise and clear it, and what to say.

    ``title`` and ``body`` are filled with the raising event's fields plus
    ``project``, ``trunk``, ``feedback_label``, and for issue causes the issue's
    ``title`` and (when held) ``question``; a missing field shows as ``?``.
    """

    name: str
    raised_by: frozenset[str]
    title: str
    body: str
    cleared_by: frozenset[str] = frozenset()
    per: str | None = None
    """Event field that tells causes of this kind apart (one per issue), or None (one)."""
    after: int = 1
    """Raised only once this many raising events came in a row (a single glitch is not
    worth a message)."""
    cleared_when_heartbeat: str | None = None
    """Heartbeat field that, true in a heartbeat newer than the last raise, clears it."""
    only_if: Callable[[NotifySettings], bool] | None = None
    """A ``notify`` setting that must be on for this cause to be told at all."""
    edge: bool = False
    """Every raising event is its own message (e.g. each merge); nothing to clear."""
    told_elsewhere: str | None = None
    """An event field that, when set, says another project tells it (an account's pause:
    the project that met it notifies, once for every project on the account)."""


CAUSES: tuple[Cause, ...] = (
    Cause("held", frozenset({"hold", "worker_blocked"}), "{issue} needs you",
          "{issue}: {issue_title}\n\n{question}\n\nAnswer on the issue, then add the label "
          "{feedback_label}.",
          cleared_by=frozenset({"resume", "passfeedback", "relayfeedback",  # its name before
                                "spawn", "restart"}), per="issue"),
    Cause("config", frozenset({"config_invalid"}),
          "the config is invalid: the swarm runs on the last good one",
          "{file}: {error}\n\nThe swarm goes on with the last good config; fix the file and "
          "it is read again at once.",
          cleared_by=frozenset({"config_reloaded"})),
    Cause("trunk_red", frozenset({"trunk_red"}), "trunk is red: merges are paused",
          "After merging {issue}, the verify command failed on {trunk} (exit {exit_code}). "
          "Merges wait until {trunk} passes again: fix it, and ralph-dev verifies it again "
          "as soon as it moves.",
          cleared_by=frozenset({"trunk_green"})),
    Cause("crash_loop", frozenset({"controller_crash_loop"}),
          "the controller keeps crashing: the swarm stopped",
          "The controller was restarted {restarts} times within {window_s} s and is still "
          "unhealthy ({reason}). See `ralph-dev logs controller --project {project}`.",
          cleared_by=frozenset({"controller_started"})),
    Cause("tracker", frozenset({"tracker_unavailable"}),
          "the tracker cannot be read: dispatch is paused",
          "The controller could not read the tracker for several ticks in a row: {error}. "
          "Running workers go on; nothing new starts until it can.",
          cleared_by=frozenset({"tracker_recovered"}), cleared_when_heartbeat="tracker_ok"),
    Cause("paused", frozenset({"swarm_paused"}), "the swarm paused: {headline}",
          "{cause}\n\n{fix}", cleared_by=frozenset({"swarm_resumed"}), per="kind",
          told_elsewhere="shared_from"),
    Cause("tracker_write", frozenset({"relay_refused"}),
          "{issue}: the tracker refused a write",
          "The tracker refused the writes {issue}'s {report} report owes: {error}. Fix the "
          "cause (often a tracker setting in ralph-dev's config); they are tried again when "
          "the config is read again.",
          cleared_by=frozenset({"relayed"}), per="issue"),
    Cause("budget", frozenset({"budget_breaker"}), "a budget breaker stopped the swarm",
          "{reason}", cleared_by=frozenset({"budget_reset"})),
    Cause("merge", frozenset({"merge"}), "{issue} merged",
          "{issue} ({issue_title}) was merged into {trunk}.", per="issue",
          only_if=lambda notify: notify.on_merge, edge=True),
)


LookupIssue = Callable[[str], Awaitable[Any]]
"""Reads one issue from the tracker (None when it cannot): a held one's question."""
Deliver = Callable[[Message], Awaitable[list[str]]]


class Notifier:
    """Follows the events log and decides what to tell, once."""

    def __init__(self, settings: ProjectSettings, store: StateStore, *,
                 lookup_issue: LookupIssue, deliver: Deliver,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.settings = settings
        self.store = store
        self.lookup_issue = lookup_issue
        self.deliver = deliver
        self.clock = clock
        self.path = store.paths.state_dir / "notify.json"
        self.offset = 0
        self.open: dict[str, dict[str, Any]] = {}
        self.cleared: dict[str, str] = {}
        self.sent: list[str] = []
        self.held_back = 0
        self._load()

    @property
    def enabled(self) -> bool:
        return bool(self.settings.notify.urls or self.settings.notify.command)

    # -- persistence --------------------------------------------------------------

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self.offset = int(data["offset"])
            self.open = {str(k): dict(v) for k, v in data.get("open", {}).items()}
            self.cleared = {str(k): str(v) for k, v in data.get("cleared", {}).items()}
            self.sent = [str(t) for t in data.get("sent", [])]
            self.held_back = int(data.get("held_back", 0))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            # first start: history is not news; remembered at once, so what happens
            # from now on is told even if this daemon stops before the next event
            self.offset = self.store.events_size()
            self._save()

    def _save(self) -> None:
        data = {"offset": self.offset, "open": self.open, "cleared": self.cleared,
                "sent": self.sent, "held_back": self.held_back}
        atomic_write_text(self.path, json.dumps(data, indent=1) + "\n")

    # -- the loop -----------------------------------------------------------------

    async def poll(self) -> int:
        """Read new events and act on them; the number of messages sent."""
        events, offset = self.store.read_events_from(self.offset)
        sent = 0
        for event in events:
            sent += await self.consume(event)
        self._clear_by_heartbeat()
        if offset != self.offset or sent:
            self.offset = offset
            self._save()
        return sent

    async def consume(self, event: Mapping[str, Any]) -> int:
        name = event.get("event")
        sent = 0
        for cause in CAUSES:
            if name in cause.cleared_by:
                self._clear(self._key(cause, event), event)
            if name in cause.raised_by:
                sent += await self._raise(cause, event)
        return sent

    def _key(self, cause: Cause, event: Mapping[str, Any]) -> str:
        if cause.per is None:
            return cause.name
        return f"{cause.name}:{str(event.get(cause.per, ''))[:80]}"

    async def _raise(self, cause: Cause, event: Mapping[str, Any]) -> int:
        if cause.only_if is not None and not cause.only_if(self.settings.notify):
            return 0
        if cause.told_elsewhere is not None and event.get(cause.told_elsewhere):
            return 0
        key = self._key(cause, event)
        if cause.edge:
            return await self._tell(cause, key, event)
        entry = self.open.setdefault(key, {"since": event.get("time"), "count": 0,
                                           "told": False})
        entry["count"] += 1
        entry["last"] = event.get("time")
        if entry["told"] or entry["count"] < cause.after:
            return 0
        entry["told"] = True
        cleared_at = from_iso(self.cleared.get(key))
        raised_at = from_iso(event.get("time")) or self.clock()
        cooldown = timedelta(seconds=self.settings.notify.cooldown)
        if cleared_at is not None and raised_at - cleared_at < cooldown:
            log.info("notify_suppressed", cause=key, why="came back within the cooldown")
            self.store.append_event("notify_suppressed", cause=key,
                                    reason="flapping: came back within notify.cooldown")
            return 0
        return await self._tell(cause, key, event)

    def _clear(self, key: str, event: Mapping[str, Any]) -> None:
        if self.open.pop(key, None) is not None:
            self.cleared[key] = str(event.get("time") or self.clock().isoformat())
            if len(self.cleared) > 1000:  # a long life: keep the newest
                self.cleared.pop(next(iter(self.cleared)))

    def _clear_by_heartbeat(self) -> None:
        waiting = [(k, c) for c in CAUSES if c.cleared_when_heartbeat
                   for k in list(self.open) if k == c.name or k.startswith(c.name + ":")]
        beat = self.store.read_heartbeat() if waiting else None
        if beat is None:
            return
        for key, cause in waiting:
            last = from_iso(self.open[key].get("last"))
            signal = cause.cleared_when_heartbeat
            cleared = signal is not None and beat.get(signal) is True
            if cleared and (last is None or beat["time"] > last):
                self._clear(key, {"time": beat["time"].isoformat()})

    # -- telling ------------------------------------------------------------------

    async def _fields(self, cause: Cause, event: Mapping[str, Any]) -> dict[str, str]:
        """What a message may say: the event's plain fields, the project's names, and for
        an issue its title and (when held) the question, as clean text."""
        from ralph_dev.control.state.status import dashboard, held_question, readable_text

        fields = {k: readable_text(str(v), 200) for k, v in event.items()
                  if isinstance(v, str | int | float) and not isinstance(v, bool)}
        fields.update(project=self.settings.name, trunk=self.settings.trunk,
                      feedback_label=self.settings.labels.user_feedback_given,
                      dashboard=dashboard(self.settings)["url"] or "")
        if event.get("event") == "swarm_paused":  # "usage limit until 14:05"
            fields["headline"] = readable_text(pause_headline(
                str(event.get("kind", "")), str(event.get("cause", "")),
                from_iso(event.get("until")), self.clock()), 200)
        identifier = event.get("issue")
        issue = await self.lookup_issue(identifier) if isinstance(identifier, str) else None
        if issue is not None:
            fields["issue_title"] = readable_text(issue.title, 200)
            _, question, _ = held_question(issue)
            fields["question"] = question or fields.get("reason") or "(no question found)"
        else:
            fields.setdefault("question", fields.get("reason") or "(no question found)")
        return fields


    async def _tell(self, cause: Cause, key: str, event: Mapping[str, Any]) -> int:
        now = self.clock()
        hour_ago = now - timedelta(hours=1)
        self.sent = [t for t in self.sent if (when := from_iso(t)) and when > hour_ago]
        if len(self.sent) >= self.settings.notify.max_per_hour:
            self.held_back += 1
            log.info("notify_suppressed", cause=key, why="notify.max_per_hour reached")
            self.store.append_event("notify_suppressed", cause=key,
                                    reason="rate limit: notify.max_per_hour reached")
            return 0
        fields = await self._fields(cause, event)
        title = f"ralph-dev {self.settings.name}: " + _fill(cause.title, fields)
        body = _fill(cause.body, fields) + (
            f"\n\nSee `ralph-dev status {self.settings.name}`"
            + (f" or {fields['dashboard']}" if fields.get("dashboard") else "") + ".")
        if self.held_back:
            body += (f"\n\n({self.held_back} other notification(s) were held back by "
                     "notify.max_per_hour; see `ralph-dev events`.)")
        # it may well end up on a terminal (a notify command, ntfy's CLI): the sanitizer
        message = Message(title=terminal_line(title), body=for_terminal(body), data={
            "project": self.settings.name, "cause": cause.name, "key": key,
            "issue": event.get("issue"), "time": event.get("time"), "event": dict(event),
        })
        self.sent.append(now.isoformat())
        self.held_back = 0
        problems = await self.deliver(message)
        for problem in problems:
            log.warning("notify_failed", cause=key, problem=problem)
        self.store.append_event("notified", cause=key, problems=problems or None)
        return 1


class _Fields(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "?"


def _fill(template: str, fields: Mapping[str, Any]) -> str:
    """``template`` with ``{name}`` filled in; a missing field shows as ``?``."""
    try:
        return template.format_map(_Fields(fields))
    except (ValueError, IndexError, AttributeError):
        return template
