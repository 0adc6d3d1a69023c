"""The controller's side of grooming: opening a run, what its worker reads, and
accepting its reports.

A groom run is a tracker issue labeled ``ralph:groom`` (a person's, or one
ralph-dev opens when ``decide`` says a run is due), so its worker has an
identifier like any other: its window, workspace, record and channel. Its
worker reads ``run/backlog.json`` (written here each tick: the open issues,
which of them have a live worker, recently finished ones and recent events)
and trunk in its workspace, and reports through ``worker propose``,
``worker prioritize`` and ``worker flag``. Accepting one checks the rules of
``core.groom`` against the controller's own view (the role from its own
record, never from the report) and queues its tracker writes in the relay
(``control.groom_relay`` makes them, exactly once).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ralph_dev.adapters import mailbox as ch
from ralph_dev.adapters.files import atomic_write_text
from ralph_dev.adapters.store import StateStore, from_iso, to_iso, utcnow
from ralph_dev.control.relay import RelayItem, RelayQueue, created_by_runs_since
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import RalphError
from ralph_dev.core.groom import (
    GroomRefused,
    admit_proposal,
    auto_accepts,
    check_priority_change,
)
from ralph_dev.core.model import IDENTIFIER_RE, Issue, NewIssue, Role
from ralph_dev.core.ports import TrackerWriter
from ralph_dev.core.text import strip_ansi

GROOM_KINDS = frozenset({"propose", "prioritize", "flag"})
"""The groom worker's reports; each writes to the tracker through the relay."""

EVENTS_SHOWN = 60
FINISHED_SHOWN = 40
DESCRIPTION_CHARS = 1500
EVENTS_SCANNED = 5000
ACCEPTED = "groom_proposal_accepted"

RUN_TITLE = "Groom the backlog"
RUN_DESCRIPTION = (
    "A groom run ralph-dev opened by itself ({why}). Its worker reads the open issues, "
    "trunk and recent events, and proposes issues (they wait in a backlog state with the "
    "label {proposed!r}), lowers or sets priorities and flags duplicates or stale issues, "
    "each with a one-line reason in a comment. It is completed when the run ends.")


async def open_run(settings: ProjectSettings, tracker: TrackerWriter, store: StateStore,
                   why: str) -> str | None:
    """Create the issue of a groom run ``decide`` found due; the next tick dispatches it.
    A tracker that fails is tried again next tick (decide still finds the run due)."""
    labels = settings.labels
    try:
        created = await tracker.create_issues([NewIssue(
            title=RUN_TITLE, labels=(labels.groom,),
            description=RUN_DESCRIPTION.format(why=why, proposed=labels.proposed))])
    except RalphError as exc:
        store.append_event("groom_open_failed", why=why, error=str(exc))
        return None
    store.append_event("groom_opened", issue=created[0], why=why)
    return created[0]


# --- what a groom worker reads ----------------------------------------------------------


def _line(text: str, limit: int) -> str:
    flat = " ".join(strip_ansi(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def backlog_view(issues: Iterable[Issue], store: StateStore) -> dict[str, Any]:
    """The project as a groom worker may read it: open issues (with ``live_worker``: it
    may not touch those), the most recently finished ones and the newest events."""
    records = store.load_records()
    ours = [i for i in issues if not i.foreign]
    open_issues = [{
        "identifier": i.identifier, "title": i.title, "state": i.state_name,
        "state_type": i.state_type.value, "priority": i.priority, "labels": sorted(i.labels),
        "parent": i.parent, "blocked_by": list(i.blocked_by),
        "live_worker": bool((r := records.get(i.identifier)) and r.running),
        "description": strip_ansi(i.description)[:DESCRIPTION_CHARS],
        "created_at": to_iso(i.created_at)} for i in ours if not i.state_type.finished]
    finished = sorted((i for i in ours if i.state_type.finished),
                      key=lambda i: to_iso(i.updated_at or i.created_at) or "", reverse=True)
    events = [{"time": e.get("time"), "event": e.get("event"), "issue": e.get("issue"),
               "reason": _line(str(e.get("reason") or e.get("why") or ""), 200)}
              for e in store.recent_events(EVENTS_SHOWN)]
    return {"open": open_issues,
            "finished": [{"identifier": i.identifier, "title": i.title, "state": i.state_name}
                         for i in finished[:FINISHED_SHOWN]],
            "events": events}


def publish_backlog(run_dir: Path, issues: Iterable[Issue], store: StateStore) -> None:
    atomic_write_text(run_dir / ch.BACKLOG_FILE,
                      json.dumps(backlog_view(issues, store), indent=1) + "\n")


# --- accepting its reports --------------------------------------------------------------


def _events_since(store: StateStore, event: str, since: datetime,
                  **match: Any) -> list[dict[str, Any]]:
    return [e for e in store.recent_events(EVENTS_SCANNED)
            if e.get("event") == event and all(e.get(k) == v for k, v in match.items())
            and (from_iso(e.get("time")) or since) >= since]


def _reason(fields: Mapping[str, Any]) -> str:
    reason = _line(str(fields.get("reason", "")), 300)
    if not reason:
        raise GroomRefused("--reason is empty: say in one line why, for the person who reads "
                           "the comment")
    return reason


def _target(fields: Mapping[str, Any], name: str, issues: Mapping[str, Issue],
            store: StateStore, key: str = "target") -> Issue:
    """An open issue of the project a groom worker may touch: not its own, and none a
    live worker is on (that worker's issue is the worker's and its person's)."""
    ident = str(fields.get(key, ""))
    if not IDENTIFIER_RE.fullmatch(ident):
        raise GroomRefused(f"{ident[:40]!r} is not an issue identifier such as ENG-12")
    issue = issues.get(ident)
    if issue is None or issue.foreign:
        raise GroomRefused(f"{ident} is not an issue of this project (see `ralph-dev worker "
                           f"backlog {name}`)")
    if key == "target" and ident == name:
        raise GroomRefused(f"{ident} is this groom run's own issue")
    if key == "target" and issue.state_type.finished:
        raise GroomRefused(f"{ident} is {issue.state_name} already: leave it")
    record = store.load_record(ident)
    if key == "target" and record is not None and record.running:
        raise GroomRefused(f"{ident} has a live {record.role.value} worker: a groom worker does "
                           "not touch an issue while it is being worked on")
    return issue


def accept(settings: ProjectSettings, store: StateStore, relay: RelayQueue,
           issues: Mapping[str, Issue], name: str, role: Role,
           report: ch.Report) -> tuple[str, dict[str, Any]]:
    """Check one groom report against the rules and queue its tracker writes."""
    if role is not Role.GROOM:
        raise GroomRefused(f"only a groom worker proposes issues, changes priorities or flags "
                           f"issues; this is the {role.value} worker of {name}. Say it with "
                           "`ralph-dev worker note` instead.")
    fields, now = report.fields, utcnow()
    reason = _reason(fields)
    body: dict[str, Any] = {"reason": reason}
    if report.kind == "propose":
        title = _line(str(fields.get("title", "")), 200)
        priority = fields.get("priority", 0)
        if not title:
            raise GroomRefused("--title is empty: name the missing work in a few words")
        if priority not in range(5) or isinstance(priority, bool):
            raise GroomRefused(f"priority {priority!r} is not 0-4 (0 = none, 1 = urgent, 4 = low)")
        record = store.load_record(name)
        started = record.started_at if record and record.started_at else now
        admit_proposal(this_run=len(_events_since(store, ACCEPTED, started, issue=name)),
                       per_run=settings.groom.proposals,
                       last_hour=created_by_runs_since(store, now - timedelta(hours=1)),
                       per_hour=settings.limits.plan_issues_per_hour)
        ready = auto_accepts(len(_events_since(store, ACCEPTED, now - timedelta(days=1),
                                               ready=True)), settings.groom.auto_accept_per_day)
        body |= {"title": title, "priority": priority, "ready": ready,
                 "description": strip_ansi(str(fields.get("description", "")))[:20000].strip()}
        store.append_event(ACCEPTED, issue=name, ready=ready)
        where = ("a ready state (groom.auto_accept_per_day)" if ready
                 else "the backlog, until a person accepts it")
        message = f"the proposal is being created in {where}."
    elif report.kind == "prioritize":
        target = _target(fields, name, issues, store)
        priority = fields.get("priority")
        check_priority_change(target.priority, priority if isinstance(priority, int) else -1,
                              proposed=settings.labels.proposed in target.labels)
        body |= {"target": target.identifier, "priority": priority, "was": target.priority}
        store.append_event("groom_prioritize_accepted", issue=name, target=target.identifier,
                           priority=priority)
        message = f"the priority of {target.identifier} is being set."
    else:
        target = _target(fields, name, issues, store)
        of = None
        if fields.get("duplicate_of"):
            of = _target(fields, name, issues, store, key="duplicate_of").identifier
            if of == target.identifier:
                raise GroomRefused("an issue is not a duplicate of itself")
        elif not fields.get("stale"):
            raise GroomRefused("say what to flag: --duplicate-of ISSUE or --stale")
        body |= {"target": target.identifier, "duplicate_of": of}
        store.append_event("groom_flag_accepted", issue=name, target=target.identifier,
                           duplicate_of=of)
        message = f"{target.identifier} is being flagged."
    relay.add(RelayItem(report.id, report.kind, name, body))
    return message, {}
