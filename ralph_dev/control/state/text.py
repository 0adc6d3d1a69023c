"""The state document as people read it in a terminal: ``status``, ``events``.

Times are shown in local time with the zone. Text from outside (titles, questions,
labels, names, agents' output, errors) goes through the one terminal sanitizer
(``core.text``): each field as one line where it is one, and the whole view once more,
so no escape sequence in an issue reaches the person's terminal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ralph_dev.adapters.store import from_iso, utcnow
from ralph_dev.control.daemon.web.access import LOGIN_TTL
from ralph_dev.control.state.disk import human_bytes
from ralph_dev.control.state.status import ON_HOLD_SHOWN, age
from ralph_dev.core.text import for_terminal, terminal_line


def local_time(value: Any, *, now: datetime | None = None) -> str:
    """An ISO time (or datetime) as local time with the zone's name; the date too when it
    is not today."""
    when = value if isinstance(value, datetime) else from_iso(value)
    if when is None:
        return "-"
    when = when.astimezone()
    today = (now or utcnow()).astimezone().date()
    shown = when.strftime("%H:%M:%S %Z") if when.date() == today \
        else when.strftime("%Y-%m-%d %H:%M %Z")
    return shown.strip()


def fmt_secs(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.0f}s"
    if value < 7200:
        return f"{value / 60:.0f}m"
    if value < 172800:
        return f"{value / 3600:.1f}h"
    return f"{value / 86400:.1f}d"


def render_fleet(docs: Sequence[Mapping[str, Any]],
                 logins: Sequence[str | None]) -> str:
    """Every project's state document: what needs a person in any project first (each
    need under its project's name), then each project as ``render`` shows it."""
    if len(docs) == 1:
        return render(docs[0], login=logins[0])
    lines = []
    if any(doc["needs_you"] for doc in docs):
        lines.append("NEEDS YOU (every project):")
        for doc in docs:
            if doc["needs_you"]:
                lines.append(f"  {doc['project']}:")
                for need in doc["needs_you"]:
                    lines += _need_lines(need)
        lines.append("")
    views = [render(doc, login=login, needs=False)
             for doc, login in zip(docs, logins, strict=True)]
    return "\n".join(lines) + "\n\n".join(views)


def render(doc: Mapping[str, Any], *, login: str | None = None, needs: bool = True) -> str:
    """The state document as text for a terminal (and for the supervisor's prompt):
    what needs a person first (``needs``: False when ``render_fleet`` said it already).
    ``login``: a one-time link into the dashboard, for the person's own terminal only
    (never in the document, which the API and the supervisor get)."""
    lines = [f"project {doc['project']}  (tmux session {terminal_line(doc['session'])})  "
             f"at {local_time(doc['generated_at'])}"]
    if doc["needs_you"] and not needs:
        lines.append(f"  NEEDS YOU:  {len(doc['needs_you'])} thing(s), said above")
    elif doc["needs_you"]:
        lines.append("  NEEDS YOU:")
        for need in doc["needs_you"]:
            lines += _need_lines(need)
    for pause in doc.get("pauses") or ():
        said = terminal_line(pause["headline"], 120)
        lines.append(f"  PAUSED:     {said}" + ("" if pause["headline"].startswith(
            pause["cause"]) else f" ({terminal_line(pause['cause'], 160)})"))
    daemon, ctl = doc["daemon"], doc["controller"]
    running = f"running, pid {daemon['pid']}" if daemon["running"] else "not running"
    lines.append(f"  daemon:     {running}")
    if ctl["alive"]:
        age = ctl["heartbeat_age_s"]
        beat = (f"heartbeat {age:.0f}s ago, tick {ctl['tick']}" if age is not None
                else "no heartbeat yet")
        lines.append(f"  controller: alive, {beat}" + ("" if ctl["healthy"] else
                                                         f" (unhealthy: {ctl['why']})"))
    else:
        lines.append(f"  controller: {'exited' if ctl['window'] else 'not running'}")
    if doc["dashboard"]["url"] and login:
        lines.append(f"  dashboard:  {login}")
        lines.append(f"              (a login link: it works once, within {LOGIN_TTL / 60:.0f} "
                     "minutes; `status` prints a new one)")
    elif doc["dashboard"]["url"]:
        lines.append(f"  dashboard:  {doc['dashboard']['url']}")
    elif doc["dashboard"]["error"]:
        lines.append(f"  dashboard:  not served: {terminal_line(doc['dashboard']['error'])}")
    trunk = doc["trunk"]
    head = (trunk["head"] or "?")[:12]
    lines.append(f"  trunk:      {trunk['name']} at {head}, {trunk['colour']}"
                 + (f" (jj: {terminal_line(trunk['error'])})" if trunk["error"] else "")
                 + (f": {terminal_line(trunk['subject'], 60)}" if trunk.get("subject") else ""))
    lines += lane_lines(doc.get("lane"))
    disk = doc.get("disk") or {}
    if disk.get("workspaces"):
        biggest = sorted(disk["workspaces"].items(), key=lambda kv: -kv[1])[:3]
        lines.append(f"  disk:       {human_bytes(disk['total_bytes'])} in workspaces ("
                     + ", ".join(f"{k} {human_bytes(v)}" for k, v in biggest) + ")")
    tracker = doc["tracker"]
    usage = tracker.get("usage") or {}
    if tracker["error"]:
        lines.append(f"  tracker:    ERROR {terminal_line(tracker['error'])}")
    elif usage:
        lines.append(f"  tracker:    {usage.get('requests_this_hour', '?')} requests and "
                     f"{usage.get('complexity_this_hour', '?')} complexity points this hour")
    counts = doc["issues"]
    order = ("held", "ready", "running", "blocked", "waiting", "done", "total")
    lines.append("  issues:     " + ", ".join(f"{k} {counts.get(k, 0)}" for k in order))
    on_hold = [i for i in doc["board"]["held"] if not i["needs_you"]]
    for item in on_hold[:ON_HOLD_SHOWN]:
        lines.append(f"  on hold:    {item['identifier']}  {terminal_line(item['title'], 60)}  "
                     f"({terminal_line(item['why'])})")
    if len(on_hold) > ON_HOLD_SHOWN:
        lines.append(f"  on hold:    … and {len(on_hold) - ON_HOLD_SHOWN} more")
    waiting = [i for column in ("waiting", "ready", "blocked") for i in doc["board"][column]
               if i.get("wait")]
    for item in waiting[:ON_HOLD_SHOWN]:
        lines.append(f"  waits:      {item['identifier']}  {terminal_line(item['title'], 40)}  "
                     f"({terminal_line(wait_text(item['wait']), 160)})")
    if len(waiting) > ON_HOLD_SHOWN:
        lines.append(f"  waits:      … and {len(waiting) - ON_HOLD_SHOWN} more")
    if (host := doc.get("host")) is not None:
        parts = ", ".join(f"{terminal_line(name)}: {load['used']}"
                          + (f" (+{load['wanting']} waiting)" if load["wanting"] else "")
                          for name, load in sorted(host["projects"].items()))
        lines.append(f"  host:       {host['used']}/{host['max_workers']} workers, every "
                     f"project ([host] max_workers)" + (f": {parts}" if parts else ""))
    if (account := doc.get("account")) is not None and account["windows"]:
        lines += account_lines(account)  # (an API key's windows are not read: no line)
    if (on_cluster := doc.get("cluster")) is not None:
        hosts = ", ".join(f"{terminal_line(n['host'], 30)} ({n['node'][:8]}) "
                          f"{n['workers']}/{n['slots']}" for n in on_cluster["nodes"])
        free = on_cluster["free_slots"]
        lines.append(f"  cluster:    {'?' if free is None else free} free slot(s)"
                     + (f"; {hosts}" if hosts else "; no node with worker slots"))
    costs = doc["costs"]
    if costs["known"]:
        tokens = costs["tokens"] or {}
        spent = f"${costs['cost_usd']:.2f}, " if costs["cost_usd"] is not None else ""
        lines.append(f"  costs:      {spent}" + ", ".join(f"{k} {v:.0f}" for k, v in tokens.items())
                     + " tokens (live workers)")
    if doc["workers"]:
        lines.append("")
        lines.append(f"  {'ISSUE':<10} {'ROLE':<9} {'STATE':<12} {'TRY':>3} {'AGE':>6} "
                     f"{'IDLE':>6}  LAST OUTPUT")
        for w in doc["workers"]:
            lines.append(
                f"  {w['issue']:<10} {w['role'] or '?':<9} "
                f"{w['state'] + (' @' + w['host'] if w.get('host') else ''):<12} "
                f"{w['attempt'] if w['attempt'] is not None else '-':>3} "
                f"{fmt_secs(w['age_s']):>6} {fmt_secs(w['idle_s']):>6}  "
                f"{terminal_line(w['last_output'], 60)}"
            )
    else:
        lines.append("  workers:    none")
    if doc["events"]:
        lines.append("")
        lines.append("  recent events:")
        for event in doc["events"]:
            lines.append("    " + format_event(event))
    return for_terminal("\n".join(lines))


def lane_lines(lane: Mapping[str, Any] | None) -> list[str]:
    """The merge lane: the verify running beside the loop, what waits, what went back."""
    if not lane:
        return []
    run = lane.get("run")
    if run is None:
        said = "idle"
    elif run["kind"] == "trunk":
        said = f"verifying trunk ({run['state']})"
        if run["state"] == "running" and run.get("running_s") is not None:
            said += f" for {fmt_secs(run['running_s'])}"
    else:
        batch = ", ".join(run["batch"])
        said = {"running": f"verifying {batch}", "passed": f"{batch} passed",
                "failed": f"{batch} failed (exit {run.get('exit_code')})",
                "lost": f"verifying {batch} again (its process was lost)",
                "void": f"last batch ({batch}) void: {terminal_line(run.get('why') or '', 80)}",
                "concluded": f"last batch: {terminal_line(run.get('why') or batch, 100)}",
                }.get(run["state"], f"{batch}: {run['state']}")
        if run["state"] == "running" and run.get("running_s") is not None:
            said += f" for {fmt_secs(run['running_s'])}"
        if run.get("step"):
            said += f" — {run['step']}"
    if lane.get("waiting"):
        said += f"; waiting: {', '.join(lane['waiting'][:8])}" + (
            f" and {len(lane['waiting']) - 8} more" if len(lane["waiting"]) > 8 else "")
    lines = [f"  merges:     {lane['mode']}, {said}"]
    for back in lane.get("sent_back", [])[:3]:
        lines.append(f"              sent back {back.get('issue')} at "
                     f"{local_time(back.get('time'))}: "
                     f"{terminal_line(back.get('why') or '', 100)}")
    return lines


def account_lines(account: Mapping[str, Any], now: datetime | None = None) -> list[str]:
    """The account's usage windows: how much of each is used, when it starts over, and
    whether they hold new workers back."""
    now = now or utcnow()

    def when(value: str) -> str:
        due = from_iso(value)
        return f"{local_time(due)} (in {fmt_secs(age(now, due) if due else None)})"

    said = [f"{w['label']} {w['used']:.0%} used, resets "
            f"{when(w['resets_at'])}" for w in account["windows"]]
    lines = [f"  account:    {terminal_line(account['name'], 40)}: " + "; ".join(said)
             + f" (reserve {account['reserve']:.0%})"]
    if (pacing := account.get("pacing")) is not None:
        lines.append(f"  pacing:     {terminal_line(pacing['why'], 160)}, until "
                     f"{when(pacing['until'])}")
    return lines


def wait_text(wait: Mapping[str, Any], now: datetime | None = None) -> str:
    """What an issue waits on, in one line: the controller's reason, its due time and
    the time left (a lease waited out, a retry's backoff), the last error."""
    due = from_iso(wait.get("until"))
    left = age(now or utcnow(), due) if due is not None else None
    until = "" if due is None else f", until {local_time(due)}" + (
        f" (in {fmt_secs(left)})" if left is not None and left > 0 else "")
    last = f"; last error: {wait['last_error']}" if wait.get("last_error") else ""
    return f"{wait['why']}{until}{last}"


def _need_lines(need: Mapping[str, Any]) -> list[str]:
    if not need.get("issue"):
        return [f"    ! {terminal_line(need['message'])}"]
    since = need.get("since")
    held_for = fmt_secs(age(from_iso(since), utcnow())) if since else "?"
    head = f"    ! {need['issue']}  {terminal_line(need.get('title') or '', 60)}  (held {held_for}"
    head += f", since {local_time(since)})" if since else ")"
    body = [f"        {line}" for line in for_terminal(need["message"]).splitlines()[:8]]
    return [head, *body]


def format_event(event: Mapping[str, Any]) -> str:
    time_shown = local_time(event.get("time"))
    issue = terminal_line(str(event.get("issue", "")))
    rest = {k: v for k, v in event.items() if k not in ("time", "event", "issue", "reason")}
    extra = " ".join(f"{terminal_line(str(k))}={terminal_line(str(v))}" for k, v in rest.items())
    reason = terminal_line(str(event.get("reason", "")))
    kind = terminal_line(str(event.get("event", "")))
    return f"{time_shown} {kind:<18} {issue:<9} {reason} {extra}".rstrip()
