"""The tracker writes of workers' reports, made by the controller, exactly once.

A worker's ``done``, ``blocked``, ``note`` and ``plan`` (and a groom worker's
``propose``, ``prioritize`` and ``flag``: ``control.groom_relay``) are accepted by the
controller (``control.channel``) and queued here as one file each
(``state_dir/relay/ID.json``): the queue is the controller's own, out of every
worker's reach, and it outlives the worker, its workspace and its record. Each
item's writes are made idempotent by reading the issue first (the comment under
the report's mark is there already, the state is already the target, the plan's
sub-issues exist), so a controller killed between a write and the removal of the
item repeats nothing. A tracker outage of any length costs no attempt and loses
no report: the item waits a backoff and is tried again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import structlog

from ralph_dev.adapters.files import atomic_write_text, private_dir
from ralph_dev.adapters.store import StateStore, from_iso, to_iso, utcnow
from ralph_dev.control import groom_relay, patterns
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import TrackerError
from ralph_dev.core.model import Comment, Issue, NewIssue, Role, StateType, check_identifier
from ralph_dev.core.patterns import plan_text
from ralph_dev.core.ports import Tracker
from ralph_dev.core.text import output_block, strip_ansi

log = structlog.get_logger(__name__)

DONE_MARK = "[ralph-dev] {issue} done"
BLOCKED_MARK = "[ralph-dev] {issue} blocked: a question for a person"
NOTE_MARK = "[ralph-dev] {issue} note"

RELAY_KINDS = frozenset({"done", "blocked", "note", "plan", "propose", "prioritize", "flag"})
"""Reports that write to the tracker (the others only change ralph-dev's own state)."""

BACKOFF_FIRST = 5.0
BACKOFF_CAP = 300.0


def done_target(settings: ProjectSettings, role: Role) -> tuple[str | None, StateType | None]:
    """(state name, state type) a ``done`` moves the issue to; (None, None) = stay.

    A plan worker's issue becomes a parent: it completes when its children do
    (the controller's job), so ``done`` leaves its state alone.
    """
    if role is Role.PLAN:
        return None, None
    if role is Role.EXECUTE and settings.review_after_execute:
        return settings.review_state, None
    return None, StateType.COMPLETED


def _in_target(issue: Issue, name: str | None, type_: StateType | None) -> bool:
    if name is not None:
        return issue.state_name.casefold() == name.casefold()
    if type_ is not None:
        return issue.state_type is type_
    return True


def evidence_comment(issue: str, role: Role, summary: str, verify: dict[str, Any] | None,
                     verify_command: str | None, finished: datetime,
                     spent: dict[str, Any] | None = None) -> str:
    """The ``done`` comment: the worker's summary, the verify run's evidence and what
    the issue's agents spent so far (when their transcripts said)."""
    lines = [f"{DONE_MARK.format(issue=issue)} ({role.value} worker)", "",
             strip_ansi(summary).strip(), ""]
    if verify is None:
        why = ("no verify command is configured" if not verify_command
               else f"the {role.value} role does not run the verify command")
        lines.append(f"Evidence: none ({why}); finished {finished:%Y-%m-%dT%H:%M:%SZ}.")
    else:
        lines += [
            f"Evidence: `{strip_ansi(str(verify.get('command', '')))}` exited "
            f"{verify.get('exit_code')} at {verify.get('started_at')} UTC after "
            f"{float(verify.get('duration_s') or 0):.1f} s.",
            "Output (last lines):", output_block(str(verify.get("output_tail", ""))),
        ]
    if spent:
        lines.append(f"Spent so far: {spent.get('tokens', 0)} tokens, about "
                     f"${float(spent.get('usd', 0.0)):.2f} (estimated from list prices).")
    return "\n".join(lines) + "\n"


def _has_comment(issue: Issue, prefix: str, since: datetime | None) -> Comment | None:
    for comment in reversed(issue.comments):
        if comment.by_ralph and comment.body.startswith(prefix) and (
                since is None or comment.created_at is None or comment.created_at >= since):
            return comment
    return None


@dataclass
class RelayItem:
    """One accepted report's tracker writes, waiting to be made."""

    id: str
    kind: str
    issue: str
    body: dict[str, Any]
    attempts: int = 0
    next_at: datetime | None = None
    last_error: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "issue": self.issue, "body": self.body,
                "attempts": self.attempts, "next_at": to_iso(self.next_at),
                "last_error": self.last_error}


class RelayQueue:
    """The controller's queue of tracker writes owed to workers' reports."""

    def __init__(self, settings: ProjectSettings, store: StateStore, tracker: Tracker) -> None:
        self.settings = settings
        self.store = store
        self.tracker = tracker
        self.directory = settings.paths.relay_dir

    def path(self, item_id: str) -> Path:
        return self.directory / f"{item_id}.json"

    def add(self, item: RelayItem) -> None:
        private_dir(self.directory)
        atomic_write_text(self.path(item.id), json.dumps(item.as_json()) + "\n")

    def items(self) -> list[RelayItem]:
        out = []
        try:
            files = sorted(self.directory.glob("*.json"), key=lambda p: p.stat().st_mtime)
        except OSError:
            return []
        for path in files:
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                out.append(RelayItem(id=data["id"], kind=data["kind"],
                                     issue=check_identifier(data["issue"]),
                                     body=dict(data["body"]), attempts=int(data["attempts"]),
                                     next_at=from_iso(data.get("next_at")),
                                     last_error=str(data.get("last_error", ""))))
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("relay_item_unreadable", path=str(path))
        return out

    def owed(self) -> frozenset[str]:
        """Issues with tracker writes still owed: never dispatched again meanwhile."""
        return frozenset(item.issue for item in self.items())

    def has(self, issue: str, kind: str) -> bool:
        return any(i.issue == issue and i.kind == kind for i in self.items())

    async def flush(self, *, only: str | None = None) -> list[tuple[RelayItem, str]]:
        """Make every due item's writes; returns the items that failed, with why."""
        failed = []
        now = utcnow()
        for item in self.items():
            if (only is not None and item.id != only) or (
                    only is None and item.next_at is not None and item.next_at > now):
                continue
            try:
                details = await self._apply(item)
            except TrackerError as exc:
                item.attempts += 1
                wait = min(BACKOFF_CAP, BACKOFF_FIRST * 2 ** (item.attempts - 1))
                item.next_at, item.last_error = utcnow() + timedelta(seconds=wait), str(exc)
                self.add(item)
                self.store.append_event("relay_failed", issue=item.issue, report=item.kind,
                                        attempt=item.attempts, retry_in=wait, error=str(exc))
                failed.append((item, str(exc)))
                continue
            self.path(item.id).unlink(missing_ok=True)
            self.store.append_event("relayed", issue=item.issue, report=item.kind,
                                    attempts=item.attempts + 1, **details)
        return failed

    async def _apply(self, item: RelayItem) -> dict[str, Any]:
        match item.kind:
            case "done":
                return await self._done(item)
            case "blocked":
                await self._comment_once_and_label(
                    item, BLOCKED_MARK, self.settings.labels.user_input_needed)
            case "note":
                await self._comment_once_and_label(
                    item, NOTE_MARK, self.settings.labels.agent_feedback_given)
            case "plan":
                return await self._plan(item)
            case "propose" | "prioritize" | "flag":
                return await groom_relay.apply(self.settings, self.store, self.tracker, item)
        return {}

    async def _done(self, item: RelayItem) -> dict[str, Any]:
        role = Role(item.body["role"])
        since = from_iso(item.body.get("since"))
        issue = await self.tracker.get(item.issue)
        if issue.state_type in (StateType.CANCELED, StateType.DUPLICATE):
            return {"skipped": f"the issue is {issue.state_name}"}
        if _has_comment(issue, DONE_MARK.format(issue=item.issue), since) is None:
            body = evidence_comment(item.issue, role, str(item.body.get("summary", "")),
                                    item.body.get("verify"), self.settings.verify_command,
                                    from_iso(item.body.get("finished")) or utcnow(),
                                    item.body.get("spent"))
            await self.tracker.comment(item.issue, body, by_ralph=True)
        name, type_ = done_target(self.settings, role)
        if (name is not None or type_ is not None) and not _in_target(issue, name, type_):
            issue = await self.tracker.set_state(item.issue, name=name, type=type_)
        return {"state": issue.state_name}

    async def _comment_once_and_label(self, item: RelayItem, mark: str, label: str) -> None:
        body = f"{mark.format(issue=item.issue)}\n\n{strip_ansi(str(item.body['text'])).strip()}\n"
        since = from_iso(item.body.get("since"))
        issue = await self.tracker.get(item.issue)
        if not any(c.by_ralph and c.body == body
                   and (since is None or c.created_at is None or c.created_at >= since)
                   for c in issue.comments):
            await self.tracker.comment(item.issue, body, by_ralph=True)
        if label not in issue.labels:
            await self.tracker.add_labels(item.issue, [label])

    async def _plan(self, item: RelayItem) -> dict[str, Any]:
        issue = await self.tracker.get(item.issue)
        if issue.children:  # made before a restart: never twice
            created = list(issue.children)
        else:
            entries = [NewIssue(**{**e, "labels": tuple(e.get("labels", ())),
                                   "blocked_by": tuple(e.get("blocked_by", ()))})
                       for e in item.body["entries"]]
            created = list(await self.tracker.create_issues(entries))
            self.store.append_event("worker_plan", issue=item.issue, created=created)
        # learning keeps one record per phase, so the repeat after a restart adds nothing
        patterns.remember(self.settings, self.store, item.issue,
                          plan_text(str(item.body.get("text", "")),
                                             item.body["entries"]), created, utcnow())
        return {"created": created}


EVENTS_SCANNED = 5000


def created_by_runs_since(store: StateStore, since: datetime) -> int:
    """Issues plan workers and groom runs created since ``since`` (their ``worker_plan``
    and ``groom_proposed`` events): the hourly cap counts both."""
    return sum(len(event.get("created") or ()) for event in store.recent_events(EVENTS_SCANNED)
               if event.get("event") in ("worker_plan", "groom_proposed")
               and (from_iso(event.get("time")) or since) > since)
