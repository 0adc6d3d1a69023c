"""Accepting workers' reports: checked, recorded, and their tracker writes owed.

A worker's report (``adapters.mailbox``) is checked against the controller's own view
— the issue and the role come from the controller's record of the worker whose
directory the report is in, never from the report — and what an accepted report says
is noted as facts beside the worker's record (done, blocked, what the agent does…; an
event says so), which the next tick reads: the record itself has one writer, the
actuator. A
report that writes to the tracker is kept in the write-back queue; ``decide`` has
the actuator make those writes. What a worker's command prints is the answer
written here: refused (with why and what to do), or accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

import structlog

from ralph_dev.adapters import mailbox
from ralph_dev.adapters.accounts import AccountWindows
from ralph_dev.adapters.jj_workspaces import UnmergeableWork
from ralph_dev.adapters.store import StateStore, from_iso, to_iso, utcnow
from ralph_dev.adapters.writebacks import WriteBackItem, WriteBackQueue
from ralph_dev.control.loop import costs as spending
from ralph_dev.control.loop.worker_dirs import WorkerDirs
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import RalphError, TrackerError
from ralph_dev.core.groom import (
    GroomRefused,
    admit_proposal,
    auto_accepts,
    check_priority_change,
)
from ralph_dev.core.model import IDENTIFIER_RE, Issue, NewIssue, Role, StateType, WorkerRecord
from ralph_dev.core.patterns import PLAN_TEXT_CHARS
from ralph_dev.core.plan_admission import PlanRefused, admit_plan
from ralph_dev.core.policy import Blame
from ralph_dev.core.ports import TrackerReader, WorkerChanges
from ralph_dev.core.text import strip_ansi
from ralph_dev.core.writeback import KINDS as WRITING_KINDS

log = structlog.get_logger(__name__)

REPORTS = "reports"
"""What workers said: facts beside their records (``StateStore.note_facts``)."""
SNAPSHOT_EVERY = timedelta(seconds=20)
"""A worker's activity snapshots its workspace at most this often (jj records the edits)."""
EVENTS_SCANNED = 5000
GROOM_ACCEPTED = "groom_proposal_accepted"

WriteNow = Callable[[str], Awaitable[str | None]]
"""Make an accepted report's tracker writes now, if ``decide`` says they are due: the
error when they failed (they are tried again later), else None."""


class Refused(RalphError):
    """A report the controller will not apply; the message goes back to the worker."""


def created_by_runs_since(store: StateStore, since: datetime) -> int:
    """Issues plan workers and groom runs created since ``since`` (their ``worker_plan``
    and ``groom_proposed`` events): the hourly cap counts both."""
    return sum(len(event.get("created") or ()) for event in store.recent_events(EVENTS_SCANNED)
               if event.get("event") in ("worker_plan", "groom_proposed")
               and (from_iso(event.get("time")) or since) > since)


def _events_since(store: StateStore, event: str, since: datetime,
                  **match: Any) -> list[dict[str, Any]]:
    return [e for e in store.recent_events(EVENTS_SCANNED)
            if e.get("event") == event and all(e.get(k) == v for k, v in match.items())
            and (from_iso(e.get("time")) or since) >= since]


def _line(text: str, limit: int) -> str:
    flat = " ".join(strip_ansi(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def said_at(report: mailbox.Report, now: datetime) -> datetime:
    """When the worker wrote the report (its own clock, never later than now): reports
    can be applied out of order, and what was said last must win."""
    return min(from_iso(report.at) or now, now)


RETRY_WAIT_CAP = timedelta(seconds=900)
"""The longest wait before a retried call believed (a garbled report never hides a hang
for long)."""


def quiet_from(report: mailbox.Report, now: datetime) -> datetime:
    """When the agent's silence starts counting after an ``activity`` report: now, or, for
    a retry its CLI announced (``retry_in``: seconds until the retried call goes out),
    when that call goes out. A CLI waiting out a refused call by itself is alive, and
    its next call may hang for ``hang_timeout`` from its start, not from the
    announcement."""
    wait = report.fields.get("retry_in")
    if not isinstance(wait, int | float) or isinstance(wait, bool) or not wait > 0:
        return now
    return max(now, said_at(report, now) + min(timedelta(seconds=float(wait)),
                                               RETRY_WAIT_CAP))


class Intake:
    """One project's acceptance of its workers' reports."""

    def __init__(self, settings: ProjectSettings, *, store: StateStore, dirs: WorkerDirs,
                 writebacks: WriteBackQueue, jj: WorkerChanges,
                 tracker: TrackerReader, windows: AccountWindows | None = None) -> None:
        self.settings = settings
        self.windows = windows
        """The usage windows of the account this project's agents run on."""
        self.store = store
        self.tracker = tracker
        self.dirs = dirs
        self.writebacks = writebacks
        self.jj = jj
        self.write_now: WriteNow | None = None
        """Set by the controller: an accepted report's writes made at once, when due."""
        self._locks: dict[str, asyncio.Lock] = {}
        self._snapshotted: dict[str, datetime] = {}

    @property
    def issues(self) -> Mapping[str, Issue]:
        return self.dirs.issues

    async def accept_all(self) -> None:
        for name in self.dirs.names():
            await self.accept(name)

    async def hear(self, name: str, report_id: str) -> mailbox.Answer | None:
        """A worker's poke: accept its outbox; the answer to the report it waits for."""
        answers = await self.accept(name)
        return answers.get(report_id) or mailbox.read_answer(self.dirs.run_dir(name), report_id)

    async def accept(self, name: str) -> dict[str, mailbox.Answer]:
        """Apply every unanswered report in ``name``'s outbox; their answers by id."""
        lock = self._locks.setdefault(name, asyncio.Lock())
        answers: dict[str, mailbox.Answer] = {}
        async with lock:
            run = self.dirs.run_dir(name)
            for path, report in mailbox.pending_reports(run):
                if report is None:
                    self.store.append_event("report_refused", issue=name, file=path.name[:80],
                                            why="malformed")
                    path.unlink(missing_ok=True)
                    continue
                answer = await self._accept_one(name, report)
                answers[report.id] = answer
                if report.kind in WRITING_KINDS or not answer.ok:
                    mailbox.write_answer(run, answer)
                else:  # news (activity, session…): nothing to keep
                    path.unlink(missing_ok=True)
        return answers

    async def _accept_one(self, name: str, report: mailbox.Report) -> mailbox.Answer:
        record = self.store.load_record(name)
        if record is None:
            return mailbox.Answer(report.id, False,
                                  f"ralph-dev has no worker for {name} now; stop")
        try:
            message, data = await self._apply(name, record.role, report)
        except (Refused, GroomRefused) as exc:
            if report.kind == "done":  # the cause a person needs if the worker then stops
                self.store.note_facts(name, REPORTS, last_refusal=str(exc)[:500])
            return mailbox.Answer(report.id, False, str(exc))
        except (RalphError, OSError) as exc:
            log.warning("report_failed", issue=name, report=report.kind, error=str(exc))
            return mailbox.Answer(report.id, False, f"ralph-dev could not apply it: {exc}")
        pending = False
        if report.kind in WRITING_KINDS and self.write_now is not None:
            error = await self.write_now(report.id)
            pending = error is not None
            owed = self.writebacks.get(report.id) if pending else None
            if owed is not None and owed.blame == Blame.PERMANENT:
                message += (f" But the tracker refused its writes ({error}): they wait "
                            "until a person fixes the cause, and `ralph-dev status` tells "
                            "them. Your report is kept.")
            elif pending:
                message += (f" The tracker did not answer ({error}); ralph-dev makes the "
                            "tracker writes when it does. Nothing is lost.")
        return mailbox.Answer(report.id, True, message, pending=pending, data=data)

    def _owe(self, report: mailbox.Report, name: str, body: dict[str, Any]) -> None:
        self.writebacks.add(WriteBackItem(report.id, report.kind, name, body))

    async def _apply(self, name: str, role: Role, report: mailbox.Report
                     ) -> tuple[str, dict[str, Any]]:
        fields, now = report.fields, utcnow()
        record = self.store.load_record(name)
        since = to_iso(record.started_at) if record else None
        issue = self.issues.get(name)
        match report.kind:
            case "done":
                return await self._done(name, role, fields, issue, since, report)
            case "blocked" | "note":
                text = strip_ansi(str(fields.get("text", ""))).strip()
                if not text:
                    raise Refused(f"the {report.kind} is empty: write what a person should know")
                self._owe(report, name, {"text": text[:20000], "since": since})
                if report.kind == "blocked":
                    self.store.note_facts(name, REPORTS, blocked=True)
                self.store.append_event(f"worker_{report.kind}", issue=name, role=role)
                return (f"{name} is waiting for a person." if report.kind == "blocked"
                        else f"note posted on {name}."), {}
            case "plan":
                return self._plan(name, role, fields, issue, report)
            case "propose" | "prioritize" | "flag":
                return self._groom(name, role, report)
            case "verify_failed":
                self.store.note_facts(
                    name, REPORTS, last_failure=f"verify failed: exit {fields.get('exit_code')}")
                self.store.append_event("verify_failed", issue=name,
                                        exit_code=fields.get("exit_code"),
                                        seconds=fields.get("duration_s"))
            case "session":
                self.store.note_facts(name, REPORTS, last_activity=now,
                                      **mailbox.session_fields(fields))
            case "agent_error":
                self.store.note_facts(
                    name, REPORTS, agent_error=str(fields.get("error", "unknown"))[:40],
                    agent_error_text=str(fields.get("text", ""))[:300],
                    agent_error_at=said_at(report, now), last_activity=now,
                    # with the error itself, so no reader sees the one without the other
                    **self._state(record, dataclasses.replace(report, fields={
                        "state": f"api error: {str(fields.get('error', 'unknown'))[:40]}"}),
                        now),
                    agent_error_reset_at=from_iso(fields.get("reset_at")),
                    agent_error_streak=(record.agent_error_streak if record else 0) + 1)
                self.store.append_event("agent_api_error", issue=name,
                                        error=str(fields.get("error", "unknown"))[:40],
                                        text=str(fields.get("text", ""))[:300],
                                        reset_at=fields.get("reset_at"))
            case "iteration_cap":  # it ended turn after turn without reporting or asking
                said = fields.get("message")
                self.store.note_facts(name, REPORTS, gave_up=strip_ansi(said)[:2000].strip()
                                      if isinstance(said, str) else "")
                self.store.append_event("iteration_cap", issue=name,
                                        iterations=fields.get("iterations"))
            case "activity":  # a tool call, or the Stop hook sending the agent back
                count = fields.get("iterations")
                # the model answered: unless an API error came after this report was written
                answered = record is None or record.agent_error_at is None \
                    or said_at(report, now) >= record.agent_error_at
                self.store.note_facts(name, REPORTS, last_activity=quiet_from(report, now), **(
                    {"agent_error_streak": 0, "hang_restarts": 0} if answered else {}), **(
                    {"iterations": count} if isinstance(count, int) and count >= 0 else {}),
                    **self._state(record, report, now))
                await self._snapshot(name)
            case "diff":  # the worker wants its diff now: snapshot it from outside
                self._snapshotted.pop(name, None)
                await self._snapshot(name)
            case "windows":  # the account's usage windows, as its agent read them
                said = mailbox.window_fields(fields)
                if self.windows is not None and self.windows.note(said, now):
                    self.store.append_event("account_windows", issue=name, **{
                        window: round(used, 3) for window, (used, _) in said.items()})
            case "state":  # what the agent does now, from its own hooks
                self.store.note_facts(name, REPORTS, **self._state(record, report, now), **(
                    {"last_activity": now} if fields.get("active") is True else {}))
        return "noted", {}

    @staticmethod
    def _state(record: WorkerRecord | None, report: mailbox.Report, now: datetime
               ) -> dict[str, Any]:
        """What the agent said it does, unless it said something newer already: a report
        from the outbox can be applied after a later one that came through the socket
        (a controller that just started listening), and the older must not win. Its time
        is the worker's own, never later than now."""
        said = said_at(report, now)
        if record is not None and record.agent_state_at is not None \
                and said < record.agent_state_at:
            return {}
        return mailbox.state_fields(report.fields, said)

    async def _snapshot(self, name: str) -> None:
        last = self._snapshotted.get(name)
        if last is not None and utcnow() - last < SNAPSHOT_EVERY:
            return
        self._snapshotted[name] = utcnow()
        try:
            await asyncio.to_thread(self.jj.snapshot, name)
        except RalphError as exc:
            log.info("snapshot_failed", issue=name, error=str(exc))
        await asyncio.to_thread(self.dirs.publish_diff, name)

    # -- done and plan ----------------------------------------------------------------------

    async def _done(self, name: str, role: Role, fields: Mapping[str, Any], issue: Issue | None,
                    since: str | None, report: mailbox.Report) -> tuple[str, dict[str, Any]]:
        record = self.store.load_record(name)
        if record is not None and record.done:
            return f"{name} was already reported done; nothing changed.", {"already": True}
        if issue is not None and issue.state_type in (StateType.CANCELED, StateType.DUPLICATE):
            raise Refused(f"{name} was {issue.state_name.lower()} in the tracker: stop working "
                          "on it (nothing to report)")
        if role is Role.PLAN and not (issue and issue.children) \
                and not self.writebacks.has(name, "plan") and not self.planned(name):
            raise Refused(f"{name} has no sub-issues yet: a plan worker first runs `ralph-dev "
                          f"worker plan {name} --file PLAN`, then `worker done`")
        summary = strip_ansi(str(fields.get("summary", ""))).strip()
        if not summary:
            raise Refused("--summary is empty: say in a few sentences what you did and how "
                          "you checked it")
        if role.may_edit:
            if issue is None:  # reported before this controller's first look at the tracker
                with contextlib.suppress(TrackerError):
                    issue = await self.tracker.get(name)
            title = " ".join(strip_ansi(issue.title if issue else "").split())[:200]
            try:
                await asyncio.to_thread(self.jj.describe, name, f"{name}: {title}".rstrip(": "),
                                        require_change=role is Role.EXECUTE)
            except UnmergeableWork as exc:  # the agent can still fix it
                raise Refused(str(exc)) from None
        verify = fields.get("verify") if isinstance(fields.get("verify"), dict) else None
        ledger = spending.load(self.settings)
        spent = spending.issue_spend(ledger, name).as_json() \
            if name in ledger["issues"] else None
        self._owe(report, name, {
            "role": role.value, "summary": summary[:20000], "verify": verify, "since": since,
            "finished": to_iso(utcnow()), "spent": spent})
        self.store.note_facts(name, REPORTS, done=True, summary=summary[:20000],
                              sent_back=None)
        self.store.append_event("worker_done", issue=name, role=role,
                                verify_exit=verify.get("exit_code") if verify else None,
                                verify_seconds=verify.get("duration_s") if verify else None,
                                tokens=spent["tokens"] if spent else None,
                                cost_usd=spent["usd"] if spent else None)
        return f"{name} reported done; summary and evidence go on the issue.", {}

    def planned(self, name: str) -> bool:
        """A plan of this worker was created (its write-back made it) since it started."""
        record = self.store.load_record(name)
        since = record.started_at if record else None
        return any(e.get("event") == "worker_plan" and e.get("issue") == name
                   and (since is None or (from_iso(e.get("time")) or since) >= since)
                   for e in self.store.recent_events(EVENTS_SCANNED))

    def _plan(self, name: str, role: Role, fields: Mapping[str, Any], issue: Issue | None,
              report: mailbox.Report) -> tuple[str, dict[str, Any]]:
        if role is not Role.PLAN:
            raise Refused(f"only a plan worker creates sub-issues; this is the {role.value} "
                          f"worker of {name}. If the work is too big, say so with "
                          "`ralph-dev worker note`.")
        if (issue and issue.children) or self.writebacks.has(name, "plan") \
                or self.planned(name):
            raise Refused(f"{name} already has sub-issues: the plan exists; finish with "
                          f"`ralph-dev worker done {name} --summary …`")
        try:
            entries = [NewIssue(**{**e, "labels": tuple(e.get("labels", ())),
                                   "blocked_by": tuple(e.get("blocked_by", ()))})
                       for e in fields.get("entries", [])]
        except TypeError as exc:
            raise Refused(f"the plan is malformed ({exc}); write it in the `issue import` "
                          "format") from None
        if not entries:
            raise Refused("the plan holds no tasks: add at least one task")
        limits = self.settings.limits
        try:
            admit_plan(entries, per_plan=limits.plan_issues,
                       per_hour=limits.plan_issues_per_hour,
                       created_last_hour=created_by_runs_since(self.store, utcnow()
                                                                - timedelta(hours=1)),
                       person_only_labels=self.settings.labels.person_only())
        except PlanRefused as exc:
            self.store.append_event("plan_refused", issue=name, tasks=len(entries), why=str(exc))
            raise Refused(str(exc)) from None
        self._owe(report, name, {
            "entries": fields["entries"],
            "text": str(fields.get("text", ""))[:PLAN_TEXT_CHARS]})  # read for pattern learning
        self.store.append_event("plan_accepted", issue=name, tasks=len(entries))
        return f"the plan's {len(entries)} sub-issue(s) of {name} are being created.", {}

    # -- a groom worker's reports -------------------------------------------------------------

    def _target(self, fields: Mapping[str, Any], name: str, key: str = "target") -> Issue:
        """An open issue of the project a groom worker may touch: not its own, and none a
        live worker is on (that worker's issue is the worker's and its person's)."""
        ident = str(fields.get(key, ""))
        if not IDENTIFIER_RE.fullmatch(ident):
            raise GroomRefused(f"{ident[:40]!r} is not an issue identifier such as ENG-12")
        issue = self.issues.get(ident)
        if issue is None or issue.foreign:
            raise GroomRefused(f"{ident} is not an issue of this project (see `ralph-dev worker "
                               f"backlog {name}`)")
        if key == "target" and ident == name:
            raise GroomRefused(f"{ident} is this groom run's own issue")
        if key == "target" and issue.state_type.finished:
            raise GroomRefused(f"{ident} is {issue.state_name} already: leave it")
        record = self.store.load_record(ident)
        if key == "target" and record is not None and record.running:
            raise GroomRefused(f"{ident} has a live {record.role.value} worker: a groom worker "
                               "does not touch an issue while it is being worked on")
        return issue

    def _groom(self, name: str, role: Role, report: mailbox.Report
               ) -> tuple[str, dict[str, Any]]:
        """Check one groom report against the rules (``core.groom``) and owe its writes."""
        if role is not Role.GROOM:
            raise GroomRefused(f"only a groom worker proposes issues, changes priorities or "
                               f"flags issues; this is the {role.value} worker of {name}. Say "
                               "it with `ralph-dev worker note` instead.")
        fields, now, store = report.fields, utcnow(), self.store
        reason = _line(str(fields.get("reason", "")), 300)
        if not reason:
            raise GroomRefused("--reason is empty: say in one line why, for the person who "
                               "reads the comment")
        body: dict[str, Any] = {"reason": reason}
        if report.kind == "propose":
            title = _line(str(fields.get("title", "")), 200)
            priority = fields.get("priority", 0)
            if not title:
                raise GroomRefused("--title is empty: name the missing work in a few words")
            if priority not in range(5) or isinstance(priority, bool):
                raise GroomRefused(f"priority {priority!r} is not 0-4 (0 = none, 1 = urgent, "
                                   "4 = low)")
            record = store.load_record(name)
            started = record.started_at if record and record.started_at else now
            admit_proposal(this_run=len(_events_since(store, GROOM_ACCEPTED, started,
                                                      issue=name)),
                           per_run=self.settings.groom.proposals,
                           last_hour=created_by_runs_since(store, now - timedelta(hours=1)),
                           per_hour=self.settings.limits.plan_issues_per_hour)
            ready = auto_accepts(len(_events_since(store, GROOM_ACCEPTED,
                                                   now - timedelta(days=1), ready=True)),
                                 self.settings.groom.auto_accept_per_day)
            body |= {"title": title, "priority": priority, "ready": ready,
                     "description": strip_ansi(str(fields.get("description", "")))[:20000]
                     .strip()}
            store.append_event(GROOM_ACCEPTED, issue=name, ready=ready)
            where = ("a ready state (groom.auto_accept_per_day)" if ready
                     else "the backlog, until a person accepts it")
            message = f"the proposal is being created in {where}."
        elif report.kind == "prioritize":
            target = self._target(fields, name)
            priority = fields.get("priority")
            check_priority_change(target.priority, priority if isinstance(priority, int) else -1,
                                  proposed=self.settings.labels.proposed in target.labels)
            body |= {"target": target.identifier, "priority": priority, "was": target.priority}
            store.append_event("groom_prioritize_accepted", issue=name,
                               target=target.identifier, priority=priority)
            message = f"the priority of {target.identifier} is being set."
        else:
            target = self._target(fields, name)
            of = None
            if fields.get("duplicate_of"):
                of = self._target(fields, name, key="duplicate_of").identifier
                if of == target.identifier:
                    raise GroomRefused("an issue is not a duplicate of itself")
            elif not fields.get("stale"):
                raise GroomRefused("say what to flag: --duplicate-of ISSUE or --stale")
            body |= {"target": target.identifier, "duplicate_of": of}
            store.append_event("groom_flag_accepted", issue=name, target=target.identifier,
                               duplicate_of=of)
            message = f"{target.identifier} is being flagged."
        self._owe(report, name, body)
        return message, {}

