"""The state document: one versioned JSON picture of a project, for people and programs.

``ralph-dev status --json`` prints it, the daemon serves it at ``GET /api/v1/state``
(and the dashboard draws it), ``/metrics`` reads its gauges from it, and the
supervisor gets its terminal rendering. Its shape is fixed by
``state.schema.json`` (shipped next to this module) and versioned by
``schema_version``: a field is only ever added; renaming or removing one bumps the
version.

It reads only cheap sources: the daemon lock, the heartbeat, one tmux call, the
worker records, the end of the events log, one jj call for trunk, and the
tracker (cached by a long-lived reader, so a dashboard left open does not spend
the tracker's budget). Times are ISO 8601 with their UTC offset; the terminal
rendering shows local time with the zone's name.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from importlib import resources
from typing import Any

from ralph_dev.adapters.accounts import AccountWindows
from ralph_dev.adapters.host_admission import HostAdmission
from ralph_dev.adapters.processes import lock_holder
from ralph_dev.adapters.store import StateStore, to_iso, utcnow
from ralph_dev.adapters.terminal import last_words, render_tail
from ralph_dev.adapters.writebacks import WriteBackQueue
from ralph_dev.control.loop import costs as spending
from ralph_dev.control.loop.merging import read_lane
from ralph_dev.control.state.disk import workspace_sizes
from ralph_dev.control.state.pause_text import pause_entries
from ralph_dev.control.state.sources import StateSources
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.decide.lane import bisecting_said, sizes_said
from ralph_dev.core.model import (
    CONTROLLER_WINDOW,
    Issue,
    NodeSlots,
    Observed,
    Window,
    worker_windows,
)
from ralph_dev.core.pacing import WINDOW_NAMES, pace
from ralph_dev.core.policy import Blame
from ralph_dev.core.text import strip_ansi

SCHEMA_VERSION = 1
COLUMN_LIMIT = 100
"""Issues listed per board column at most (the counts are always complete)."""
DONE_LIMIT = 30
"""Finished issues listed (the newest), out of however many there are."""
QUESTION_CHARS = 1000
ON_HOLD_SHOWN = 10
"""Issues a person put on hold listed by the terminal view (the rest are counted)."""

ASKED_MARK = "blocked: a question for a person"
"""In the first line of a worker's ``worker blocked`` comment (``control.loop.act``)."""
GAVE_UP_MARK = "stopped retrying"
"""In the comment ralph-dev writes when it holds an issue at the attempt cap (``decide``)."""

_ISSUE_PREFIX = re.compile(r"^([A-Z][A-Z0-9]{0,9}-[1-9][0-9]{0,8}):")


def load_schema() -> dict[str, Any]:
    """The JSON Schema of the state document, as shipped in the package."""
    text = resources.files("ralph_dev.control.state").joinpath("state.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


def age(then: datetime | None, now: datetime) -> float | None:
    return round((now - then).total_seconds(), 1) if then else None


def heartbeat_health(beat: Mapping[str, Any] | None, stale_after: float,
                     now: datetime) -> tuple[bool, str]:
    """(healthy, why) from the controller's heartbeat alone: what ``/healthz`` answers."""
    if beat is None:
        return False, "the controller has written no heartbeat"
    age = (now - beat["time"]).total_seconds()
    if age > stale_after:
        return False, (f"the controller's heartbeat is {age:.0f}s old "
                       f"(stale after {stale_after:.0f}s)")
    return True, f"heartbeat {age:.0f}s old"


def held_question(issue: Issue) -> tuple[str | None, str | None, datetime | None]:
    """Why ralph-dev put the issue before a person, from its newest ralph-dev comment that
    did: (``question`` or ``attempt_cap``, the comment as clean text, when), or Nones."""
    for comment in reversed(issue.comments):
        if not comment.by_ralph:
            continue
        first, _, rest = comment.body.strip().partition("\n")
        if ASKED_MARK in first:
            return "question", readable_text(rest), comment.created_at
        if GAVE_UP_MARK in first:
            return "attempt_cap", readable_text(comment.body), comment.created_at
    return None, None, None


def readable_text(text: str, limit: int = QUESTION_CHARS) -> str:
    """Text from a tracker or an event made safe to show or send: no escape sequences or
    control characters, no runs of blank lines, at most ``limit`` characters."""
    text = strip_ansi(text).strip()
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tracker_ttl(settings: ProjectSettings) -> float:
    """How long a long-lived reader (the dashboard, ``status --watch``) may reuse one
    answer of the tracker: a second locally; for Linear at least 30 s, so watching the
    swarm does not spend the budget the controller needs."""
    if settings.tracker.kind == "local":
        return 1.0
    return max(30.0, settings.timing.poll_interval)




async def snapshot(settings: ProjectSettings, *, events: int = 10,
                   sources: StateSources | None = None,
                   config_error: str | None = None) -> dict[str, Any]:
    """The state document (``schema_version`` 1) for one project. ``config_error``: the
    config file cannot be read now (``settings`` are the last good ones)."""
    own = sources is None
    sources = sources or StateSources(settings)
    try:
        return await _document(settings, sources, events, config_error)
    finally:
        if own:
            await sources.close()


async def _document(settings: ProjectSettings, sources: StateSources,
                    n_events: int, config_error: str | None = None) -> dict[str, Any]:
    from ralph_dev.core.decide import COLUMNS, issue_columns

    store = sources.store
    now = utcnow()
    daemon_pid = lock_holder(settings.paths.daemon_pid)
    windows: list[Window] = await asyncio.to_thread(sources.tmux.list_windows)
    cluster_windows, free_slots, nodes = store.read_cluster() if settings.cluster \
        else ([], None, [])
    windows += cluster_windows  # workers on other hosts, as the controller last saw them
    beat = store.read_heartbeat()
    records = store.load_records()
    issues, tracker_error = await sources.issues()
    by_id = {issue.identifier: issue for issue in issues or ()}

    columns: dict[str, tuple[str, str | None]] = {}
    if issues is not None:
        observed = Observed(issues=tuple(issues), windows=tuple(windows), records=records)
        columns = issue_columns(observed, settings)

    live = {w.name for w in worker_windows(windows) if w.alive}
    waits = store.read_waits()
    for ident, (column, blocker) in list(columns.items()):
        if column == "running" and ident not in live and ident in waits:
            columns[ident] = ("waiting", blocker)  # started, but nobody on it: say why
    counts = dict.fromkeys(COLUMNS, 0)
    for column, _ in columns.values():
        counts[column] += 1
    counts["total"] = len(columns)
    board = _board(settings, by_id, columns, live, now, waits)
    workers = _workers(store, windows, records, by_id, now, spending.load(settings))
    controller = _controller(settings, windows, beat, now)
    trunk, merges = await _trunk(settings, sources)
    lane = await asyncio.to_thread(_lane, settings, store, waits, now)
    tracker = {
        "kind": settings.tracker.kind,
        "ok": tracker_error is None,
        "error": tracker_error,
        "usage": (beat or {}).get("tracker_usage"),
    }
    document = {
        "schema_version": SCHEMA_VERSION,
        "project": settings.name,
        "generated_at": now.isoformat(),
        "session": settings.session_name,
        "needs_you": [],
        "pauses": pause_entries(store.load_pauses(), now),
        "daemon": {"running": bool(daemon_pid), "pid": daemon_pid if daemon_pid else None},
        "controller": controller,
        "dashboard": dashboard(settings) if daemon_pid else {"url": None, "error": None},
        "issues": counts,
        "board": board,
        "workers": workers,
        "trunk": trunk,
        "merges": merges,
        "lane": lane,
        "tracker": tracker,
        "costs": _costs(workers),
        "disk": await asyncio.to_thread(workspace_sizes, settings),
        "events": store.recent_events(n_events),
        **({"cluster": _cluster(free_slots, nodes, workers)} if settings.cluster else {}),
        **({"host": _host(settings)} if settings.host.max_workers and not settings.cluster
           else {}),
        **({"account": _account(settings, account, now)}
           if isinstance(account := (beat or {}).get("account"), str) else {}),
    }
    needs_you = _needs_you(settings, document)
    config_error = config_error or (beat or {}).get("config_error")
    if config_error:  # first: everything else runs on the last good config meanwhile
        needs_you.insert(0, {"kind": "config", "message": (
            f"ralph-dev's config is invalid: {config_error}; the swarm goes on with the "
            "last good config until the file is fixed (it is read again at once)")})
    later = (beat or {}).get("restart_needed")
    if later and isinstance(later, list):
        needs_you.append({"kind": "config", "message": (
            f"config changes wait for a restart: {', '.join(map(str, later))}; everything "
            "else in the file applies already (`ralph-dev stop` then `start`, or `service "
            "restart`)")})
    document["needs_you"] = needs_you
    return document


def _host(settings: ProjectSettings) -> dict[str, Any]:
    """The host's workers as every project on it last published them."""
    loads = HostAdmission(settings.name).loads(own=True)
    return {"max_workers": settings.host.max_workers,
            "used": sum(load.used for load in loads.values()),
            "projects": {name: {"used": load.used, "wanting": load.wanting,
                                "share": load.share} for name, load in loads.items()}}


def _account(settings: ProjectSettings, account: str, now: datetime) -> dict[str, Any]:
    """The account the controller's agents run on: its usage windows as the API last
    stated them, and whether they hold new workers back (``core.pacing``)."""
    reserve = settings.account_settings(account).reserve
    windows = AccountWindows(account).read(now)
    hold = pace(windows, reserve, now)
    return {"name": account, "reserve": reserve,
            "windows": [{"name": w.name, "label": WINDOW_NAMES[w.name], "used": w.used,
                         "resets_at": w.resets_at.isoformat(),
                         "seen_at": w.seen_at.isoformat()} for w in windows],
            "pacing": None if hold is None else {"window": hold.window.name, "why": hold.why,
                                                 "until": hold.until.isoformat()}}


def dashboard(settings: ProjectSettings) -> dict[str, str | None]:
    """Where the running daemon serves the dashboard, or why it does not (it writes
    ``web.json`` at start)."""
    try:
        data = json.loads((settings.paths.state_dir / "web.json").read_text())
    except (OSError, ValueError):
        data = {}
    data = data if isinstance(data, dict) else {}
    url, error = data.get("url"), data.get("error")
    return {"url": url if isinstance(url, str) else None,
            "error": error if isinstance(error, str) else None}


def _item(issue: Issue) -> dict[str, Any]:
    return {
        "identifier": issue.identifier,
        "title": issue.title,
        "state": issue.state_name,
        "priority": issue.priority,
        "labels": sorted(issue.labels),
    }


def _board(settings: ProjectSettings, by_id: Mapping[str, Issue],
           columns: Mapping[str, tuple[str, str | None]], live: set[str],
           now: datetime, waits: Mapping[str, dict[str, Any]]
           ) -> dict[str, list[dict[str, Any]]]:
    from ralph_dev.core.decide import COLUMNS, dispatch_key

    labels = settings.labels
    children: dict[str, int] = {}
    for issue in by_id.values():
        if issue.parent:
            children[issue.parent] = children.get(issue.parent, 0) + 1
    board: dict[str, list[dict[str, Any]]] = {name: [] for name in COLUMNS}
    for ident, (column, blocker) in columns.items():
        issue = by_id[ident]
        item = _item(issue)
        item["wait"] = waits.get(ident) if column not in ("running", "done") else None
        if column == "held":
            item.update(_held(issue, labels.user_input_needed, labels.hold, now))
        elif column == "blocked":
            item["blocked_by"] = blocker
            item["blockers"] = [b for b in issue.blocked_by
                                if b not in by_id or not by_id[b].state_type.finished]
        elif column == "running":
            item["has_worker"] = ident in live
        elif column == "waiting":
            kids = children.get(ident, 0) or len(issue.children)
            item["why"] = (item["wait"]["why"] if item["wait"] else
                           f"parent of {kids} sub-issue(s): done when they are" if kids
                           else f"in state {issue.state_name!r}, which is not dispatched")
        elif column == "done":
            item["updated_at"] = to_iso(issue.updated_at)
        board[column].append(item)
    for column, items in board.items():
        if column == "done":
            items.sort(key=lambda i: i["updated_at"] or "", reverse=True)
            del items[DONE_LIMIT:]
        elif column == "held":
            items.sort(key=lambda i: (not i["needs_you"], i["since"] or ""))
        else:
            items.sort(key=lambda i: dispatch_key(by_id[i["identifier"]]))
        del items[COLUMN_LIMIT:]
    return board


HELD_WHY = {
    "question": "a worker asked a question",
    "attempt_cap": "ralph-dev stopped retrying at the attempt cap",
    "label": "labelled {user_input}",
    "on_hold": "on hold: a person set the label {hold}",
}


def _held(issue: Issue, user_input_label: str, hold_label: str,
          now: datetime) -> dict[str, Any]:
    names = {label.casefold() for label in issue.labels}
    needs_you = user_input_label.casefold() in names
    kind, question, asked_at = held_question(issue) if needs_you else (None, None, None)
    reason = kind or ("label" if needs_you else "on_hold")
    since = asked_at or issue.updated_at
    return {
        "needs_you": needs_you,
        "reason": reason,
        "why": HELD_WHY[reason].format(user_input=user_input_label, hold=hold_label),
        "question": question,
        "since": to_iso(since),
        "age_s": age(since, now),
    }


def _workers(store: StateStore, windows: Sequence[Window], records: Mapping[str, Any],
             by_id: Mapping[str, Issue], now: datetime,
             ledger: Mapping[str, Any]) -> list[dict[str, Any]]:
    workers = []
    for window in worker_windows(windows):
        record = records.get(window.name)
        log_path = store.log_path(window.name)
        try:
            last_output_at = datetime.fromtimestamp(log_path.stat().st_mtime).astimezone()
        except OSError:
            last_output_at = None
        if not window.alive:
            state = f"exited ({window.exit_status})"
        elif record and record.done:
            state = "done"
        elif record and record.blocked:
            state = "blocked"
        else:
            state = "running"
        started = record.started_at if record else None
        active = (record.last_activity if record else None) or last_output_at
        issue = by_id.get(window.name)
        workers.append({
            "issue": window.name,
            "title": issue.title if issue else None,
            "role": record.role.value if record else None,
            "state": state,
            "attempt": record.attempts if record else None,
            "started_at": to_iso(started),
            "age_s": age(started, now),
            "last_activity_at": to_iso(active),
            "idle_s": age(active, now),
            "agent_state": record.agent_state if record else None,  # from its hooks
            **_spend(ledger, window.name),
            "last_output": last_words(render_tail(log_path)),
            "window": window.window_id,
            "node": record.node if record else None,
            "host": record.host if record else None,
        })
    return workers


def _cluster(free_slots: int | None, nodes: Sequence[NodeSlots],
             workers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The cluster's free slots, and each node's slots with the live workers on it."""
    running = Counter(w["node"] for w in workers if w.get("node") and w["state"] == "running")
    return {"free_slots": free_slots,
            "nodes": [{"node": n.node, "host": n.host, "slots": n.slots,
                       "workers": running.get(n.node, 0)} for n in nodes]}


def _controller(settings: ProjectSettings, windows: Sequence[Window],
                beat: Mapping[str, Any] | None, now: datetime) -> dict[str, Any]:
    mine = [w for w in windows if w.name == CONTROLLER_WINDOW]
    alive = any(w.alive for w in mine)
    healthy, why = heartbeat_health(beat, settings.timing.heartbeat_stale, now)
    if not mine:
        healthy, why = False, "no controller window"
    elif not alive:
        status = next((w.exit_status for w in mine), None)
        healthy, why = False, f"the controller exited (status {status})"
    return {
        "window": bool(mine),
        "alive": alive,
        "healthy": healthy,
        "why": why,
        "heartbeat_at": to_iso(beat["time"]) if beat else None,
        "heartbeat_age_s": age(beat["time"], now) if beat else None,
        "tick": beat.get("tick") if beat else None,
        "acting": beat.get("acting") if beat else None,
    }


async def _trunk(settings: ProjectSettings,
                 sources: StateSources) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    changes, error = await sources.trunk_changes()
    red = None
    try:
        red_data = json.loads(settings.paths.trunk_red_file.read_text())
    except FileNotFoundError:
        red_data = None
    except (OSError, ValueError):
        red_data = {}
    if red_data is not None:
        red = {key: red_data.get(key) for key in ("command", "exit_code", "commit")} \
            if isinstance(red_data, dict) else {}
    if red is not None:
        colour = "red"
    elif settings.verify_command and (settings.merge.verify_trunk or settings.verifies_merges):
        colour = "green"
    else:
        colour = "unverified"
    trunk = {
        "name": settings.trunk,
        "head": changes[0].commit if changes else None,
        "subject": changes[0].title if changes else None,
        "colour": colour,
        "red": red,
        "error": error,
    }
    merges = []
    for change in changes or ():
        found = _ISSUE_PREFIX.match(change.title)
        merges.append({
            "commit": change.commit,
            "issue": found.group(1) if found else None,
            "title": change.title,
            "time": change.time,
            "added": change.added,
            "removed": change.removed,
            "files": list(change.files[:20]),
            "files_changed": len(change.files),
        })
    return trunk, merges


SENT_BACK_SHOWN = 5
"""Changes the lane sent back lately, listed (the newest)."""


def _lane(settings: ProjectSettings, store: StateStore, waits: Mapping[str, Any],
          now: datetime) -> dict[str, Any]:
    """The merge lane: how it merges, the verify running beside the loop (the batch,
    since when, which step of a bisection), what waits behind it, what went back lately
    and why."""
    if settings.merge.mode == "pr":
        mode = "pull requests"
    elif settings.verifies_merges:
        mode = "verified" if settings.merge.max_batch > 1 else "verified, one at a time"
    else:
        mode = "unverified"
    run = read_lane(settings.paths.lane_dir)
    shown: dict[str, Any] | None = None
    if run is not None:
        bisecting = run.kind == "merge" and run.bad > 0
        beside = sorted(p.size for p in run.also)
        step = None
        if bisecting:
            step = bisecting_said([*beside, run.size], len(run.batch), run.good, run.bad)
        elif beside:
            step = f"its first {sizes_said(beside)} verified beside it, should it fail"
        shown = {
            "id": run.id, "kind": run.kind, "state": run.state,
            "batch": list(run.members), "of": list(run.batch) if bisecting else None,
            "step": step,
            "at_once": [{"size": p.size, "state": p.state, "exit_code": p.exit_code}
                        for p in sorted(run.also, key=lambda p: p.size)] or None,
            "since": to_iso(run.started_at),
            "running_s": age(run.started_at, now) if run.state == "running" else None,
            "finished_at": to_iso(run.finished_at), "exit_code": run.exit_code,
            "why": run.why, "after": list(run.after) or None,
        }
    waiting = sorted(ident for ident, wait in waits.items()
                     if isinstance(wait, Mapping) and wait.get("kind") == "merge"
                     and (shown is None or ident not in shown["batch"]))
    sent_back = [{"issue": e.get("issue"), "time": e.get("time"), "exit_code": e.get("exit_code"),
                  "why": e.get("reason")}
                 for e in store.recent_events(500) if e.get("event") == "merge_sent_back"]
    return {
        "mode": mode,
        "max_batch": settings.merge.max_batch,
        "parallel_verifies": settings.merge.parallel_verifies,
        "run": shown,
        "state": shown["state"] if shown else "idle",
        "batch": shown["batch"] if shown and shown["kind"] == "merge" else [],
        "since": shown["since"] if shown else None,
        "waiting": waiting,
        "sent_back": sent_back[-SENT_BACK_SHOWN:][::-1],
    }


def _spend(ledger: Mapping[str, Any], issue: str) -> dict[str, Any]:
    """The issue's tokens and estimated dollars so far (all its workers), from the
    transcripts (``control.costs``); None while none were read (the command runner)."""
    if issue not in ledger["issues"]:
        return {"tokens": None, "cost_usd": None}
    spent = spending.issue_spend(ledger, issue).as_json()
    return {"tokens": {k: spent[k] for k in ("input", "output", "cache_read", "cache_write")},
            "cost_usd": spent["usd"]}


def _costs(workers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Tokens and cost of the live workers, where their agents reported them."""
    tokens: dict[str, float] = {}
    by_role: dict[str, dict[str, float]] = {}
    cost = None
    for worker in workers:
        role = worker.get("role") or "unknown"
        for kind, value in (worker.get("tokens") or {}).items():
            if isinstance(value, int | float):
                tokens[kind] = tokens.get(kind, 0) + value
                slot = by_role.setdefault(role, {})
                slot[kind] = slot.get(kind, 0) + value
        if isinstance(worker.get("cost_usd"), int | float):
            cost = (cost or 0.0) + worker["cost_usd"]
            slot = by_role.setdefault(role, {})
            slot["cost_usd"] = slot.get("cost_usd", 0) + worker["cost_usd"]
    return {"known": bool(tokens) or cost is not None, "tokens": tokens or None,
            "cost_usd": cost, "by_role": by_role}


def _needs_you(settings: ProjectSettings, doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What a person has to act on, the swarm-wide problems first, then held issues."""
    out: list[dict[str, Any]] = []
    unfinished = doc["issues"]["total"] - doc["issues"]["done"]
    if not doc["daemon"]["running"] and unfinished:
        out.append({"kind": "daemon", "message": (
            f"ralph-dev is not running for {settings.name}; {unfinished} issue(s) are "
            f"unfinished: start it with `ralph-dev start {settings.name}`")})
    elif doc["daemon"]["running"] and not doc["controller"]["healthy"]:
        out.append({"kind": "controller", "message": (
            f"the controller is not healthy: {doc['controller']['why']}; see "
            f"`ralph-dev logs controller --project {settings.name}`")})
    red = doc["trunk"]["red"]
    if red is not None:
        out.append({"kind": "trunk_red", "message": (
            f"trunk {settings.trunk} is red: `{red.get('command') or 'verify'}` failed "
            f"(exit {red.get('exit_code')}); merges wait until it passes again")})
    if doc["tracker"]["error"]:
        out.append({"kind": "tracker", "message":
                    f"the tracker cannot be read: {doc['tracker']['error']}"})
    for item in WriteBackQueue(settings.paths.relay_dir).items():
        if item.blame == Blame.PERMANENT:
            out.append({"kind": "tracker_write", "issue": item.issue, "message": (
                f"the tracker refused the writes {item.issue}'s {item.kind} report owes: "
                f"{item.last_error}; fix the cause (often a tracker setting in ralph-dev's "
                "config): they are tried again when the config is read again")})
    for item in doc["board"]["held"]:
        if item["needs_you"]:
            out.append({
                "kind": "issue",
                "issue": item["identifier"],
                "title": item["title"],
                "reason": item["reason"],
                "message": item["question"] or item["why"],
                "since": item["since"],
            })
    return out












