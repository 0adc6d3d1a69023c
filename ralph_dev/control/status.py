"""What `ralph-dev status` shows, as plain data (also the supervisor's snapshot).

Reads only cheap sources: the daemon lock, the heartbeat, one tmux call, the
worker records, the log tails, the events log and the tracker.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from ralph_dev.control.daemon import daemon_running
from ralph_dev.control.disk import human_bytes, workspace_sizes
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import RalphError, TrackerError
from ralph_dev.core.model import CONTROLLER_WINDOW, Observed, Window, worker_windows
from ralph_dev.core.state import StateStore, utcnow
from ralph_dev.core.text import file_tail, last_line


def _age(then: datetime | None, now: datetime) -> float | None:
    return round((now - then).total_seconds(), 1) if then else None


async def snapshot(settings: ProjectSettings, *, events: int = 10) -> dict[str, Any]:
    from ralph_dev.adapters.tracker import open_tracker
    from ralph_dev.control.wiring import tmux_for
    from ralph_dev.core.decide import issue_counts

    store = StateStore(settings.paths)
    now = utcnow()
    daemon_pid = daemon_running(settings.paths.daemon_pid)
    windows: list[Window] = await asyncio.to_thread(tmux_for(settings).list_windows)
    controller = [w for w in windows if w.name == CONTROLLER_WINDOW]
    beat = store.read_heartbeat()
    records = store.load_records()

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
        workers.append({
            "issue": window.name,
            "role": record.role.value if record else None,
            "state": state,
            "attempts": record.attempts if record else None,
            "age_s": _age(record.started_at if record else None, now),
            "last_activity_s": _age(
                (record.last_activity if record else None) or last_output_at, now
            ),
            "last_output": last_line(file_tail(log_path)),
            "window": window.window_id,
        })

    counts: dict[str, int] = {}
    tracker_error = None
    usage = beat.get("tracker_usage") if beat else None  # the controller's own requests
    tracker = open_tracker(settings)
    try:
        issues = await tracker.list_issues()
        counts = issue_counts(Observed(issues=tuple(issues)), settings)
    except TrackerError as exc:
        tracker_error = str(exc)
    finally:
        await tracker.close()

    recent = list(store.iter_events())[-events:] if events else []
    return {
        "trunk": await asyncio.to_thread(_trunk_head, settings),
        "disk": await asyncio.to_thread(workspace_sizes, settings),
        "project": settings.name,
        "session": settings.session_name,
        "daemon": {"running": bool(daemon_pid), "pid": daemon_pid if daemon_pid else None},
        "controller": {
            "window": bool(controller),
            "alive": any(w.alive for w in controller),
            "heartbeat_age_s": _age(beat["time"], now) if beat else None,
            "tick": beat.get("tick") if beat else None,
        },
        "workers": workers,
        "issues": counts,
        "tracker_error": tracker_error,
        "tracker_usage": usage,
        "trunk_red": settings.paths.trunk_red_file.exists(),
        "events": recent,
    }


def _trunk_head(settings: ProjectSettings) -> dict[str, str]:
    """Where trunk is: what a person pulls to get the merged work."""
    from ralph_dev.control.wiring import jj_for

    try:
        commit, subject = jj_for(settings).trunk_head()
    except RalphError as exc:
        return {"name": settings.trunk, "error": str(exc)}
    return {"name": settings.trunk, "commit": commit, "subject": subject}


def render(snap: dict[str, Any]) -> str:
    """A readable table for a terminal."""
    lines = []
    daemon = snap["daemon"]
    ctl = snap["controller"]
    lines.append(f"project {snap['project']}  (tmux session {snap['session']})")
    running = f"running, pid {daemon['pid']}" if daemon["running"] else "not running"
    lines.append(f"  daemon:     {running}")
    if ctl["alive"]:
        age = ctl["heartbeat_age_s"]
        beat = (f"heartbeat {age:.0f}s ago, tick {ctl['tick']}" if age is not None
                else "no heartbeat")
        lines.append(f"  controller: alive, {beat}")
    else:
        lines.append(f"  controller: {'exited' if ctl['window'] else 'not running'}")
    trunk = snap["trunk"]
    lines.append(f"  trunk:      {trunk['name']} at " + (
        f"{trunk['commit'][:12]} {trunk['subject'][:60]}" if "commit" in trunk
        else f"? ({trunk['error'][:80]})"))
    disk = snap["disk"]
    if disk["workspaces"]:
        biggest = sorted(disk["workspaces"].items(), key=lambda kv: -kv[1])[:3]
        lines.append(f"  disk:       {human_bytes(disk['total_bytes'])} in workspaces ("
                     + ", ".join(f"{k} {human_bytes(v)}" for k, v in biggest) + ")")
    if snap["trunk_red"]:
        lines.append("  TRUNK IS RED: merges are paused until verify passes on trunk")
    if snap["tracker_error"]:
        lines.append(f"  tracker:    ERROR {snap['tracker_error']}")
    usage = snap.get("tracker_usage") or {}
    if usage:
        lines.append(f"  tracker:    {usage.get('requests_this_hour', '?')} requests and "
                     f"{usage.get('complexity_this_hour', '?')} complexity points this hour")
    order = ("ready", "blocked", "held", "in_progress", "done", "total")
    counts = snap["issues"]
    lines.append("  issues:     " + ", ".join(f"{k.replace('_', ' ')} {counts.get(k, 0)}"
                                             for k in order))
    if snap["workers"]:
        lines.append("")
        lines.append(f"  {'ISSUE':<10} {'ROLE':<9} {'STATE':<12} {'TRY':>3} {'AGE':>6} "
                     f"{'IDLE':>6}  LAST OUTPUT")
        for w in snap["workers"]:
            lines.append(
                f"  {w['issue']:<10} {w['role'] or '?':<9} {w['state']:<12} "
                f"{w['attempts'] if w['attempts'] is not None else '-':>3} "
                f"{_fmt_secs(w['age_s']):>6} {_fmt_secs(w['last_activity_s']):>6}  "
                f"{w['last_output'][:60]}"
            )
    else:
        lines.append("  workers:    none")
    if snap["events"]:
        lines.append("")
        lines.append("  recent events:")
        for event in snap["events"]:
            lines.append("    " + format_event(event))
    return "\n".join(lines)


def _fmt_secs(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.0f}s"
    if value < 7200:
        return f"{value / 60:.0f}m"
    return f"{value / 3600:.1f}h"


def format_event(event: dict[str, Any]) -> str:
    time = str(event.get("time", ""))[11:19]
    issue = event.get("issue", "")
    rest = {k: v for k, v in event.items() if k not in ("time", "event", "issue", "reason")}
    extra = " ".join(f"{k}={v}" for k, v in rest.items())
    reason = event.get("reason", "")
    return f"{time} {event.get('event', ''):<18} {issue:<9} {reason} {extra}".rstrip()

