"""The controller's end of the worker channel (``adapters.mailbox``): run dirs, sockets,
and accepting workers' reports.

At each spawn the controller prepares the worker's own directory
(``state_dir/workers/ISSUE/{run,home,tmp}``, 0700) and tells the worker who it is
in ``run/worker.json``; each tick it refreshes ``run/issue.json``, its view of the
issue, which the worker's SessionStart context and ``worker feedback`` read. It
listens on every worker's ``run/ctl.sock``; a connection means "my outbox has a
report". Accepting a report changes ralph-dev's own state at once (the record is
done, blocked…; an event says so) and queues its tracker writes in the
``control.relay`` queue (now if the tracker answers, later if not). The issue and
the role come from the controller's record of the worker whose directory the report
is in, never from the report."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import structlog

from ralph_dev.adapters import mailbox as ch
from ralph_dev.adapters.files import atomic_write_text, private_dir
from ralph_dev.adapters.jj_workspaces import UnmergeableWork
from ralph_dev.adapters.store import StateStore, from_iso, to_iso, utcnow
from ralph_dev.control import costs as spending
from ralph_dev.control import groom
from ralph_dev.control.relay import (
    EVENTS_SCANNED,
    RELAY_KINDS,
    RelayItem,
    RelayQueue,
    created_by_runs_since,
)
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import RalphError
from ralph_dev.core.groom import GroomRefused
from ralph_dev.core.model import (
    Issue,
    NewIssue,
    Observed,
    Role,
    StateType,
    worker_windows,
)
from ralph_dev.core.patterns import PLAN_TEXT_CHARS
from ralph_dev.core.plan_admission import PlanRefused, admit_plan
from ralph_dev.core.ports import Tracker, Workspaces
from ralph_dev.core.text import strip_ansi

log = structlog.get_logger(__name__)

SNAPSHOT_EVERY = timedelta(seconds=20)
"""A worker's activity snapshots its workspace at most this often (jj records the edits)."""


class Refused(RalphError):
    """A report the controller will not apply; the message goes back to the worker."""


def issue_view(issue: Issue, related: Mapping[str, Issue]) -> dict[str, Any]:
    """The issue as a worker may read it (``run/issue.json``): its text, state, labels,
    relations and comments, plus the titles and states of its parent and blockers."""
    def one(i: Issue) -> dict[str, Any]:
        return {"identifier": i.identifier, "title": i.title, "state_name": i.state_name,
                "state_type": i.state_type.value, "description": i.description,
                "labels": sorted(i.labels), "parent": i.parent, "children": list(i.children),
                "blocked_by": list(i.blocked_by),
                "comments": [{"author": c.author, "body": c.body, "by_ralph": c.by_ralph,
                              "by_bot": c.by_bot, "created_at": to_iso(c.created_at)}
                             for c in i.comments]}
    wanted = [x for x in (issue.parent, *issue.blocked_by) if x]
    return {**one(issue), "related": {k: {"title": related[k].title,
                                          "state_name": related[k].state_name}
                                      for k in wanted if k in related}}


class Channel:
    """Run dirs, listeners and report acceptance for one project's workers."""

    def __init__(self, settings: ProjectSettings, *, store: StateStore, tracker: Tracker,
                 jj: Workspaces, wake: Callable[[], None] = lambda: None) -> None:
        self.settings = settings
        self.store = store
        self.jj = jj
        self.wake = wake
        self.relay = RelayQueue(settings, store, tracker)
        self.issues: dict[str, Issue] = {}
        self._servers: dict[str, tuple[asyncio.AbstractServer, int]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._snapshotted: dict[str, Any] = {}

    # -- run dirs -------------------------------------------------------------------------

    def worker_dir(self, issue: str) -> Path:
        return self.settings.paths.worker_dir(issue)

    def run_dir(self, issue: str) -> Path:
        return self.worker_dir(issue) / "run"

    def prepare(self, issue: Issue, role: Role, workspace: Path, attempt: int) -> Path:
        """The worker's own dirs and its ``worker.json``/``issue.json``; returns the worker
        dir. Kept across restarts of the same issue (its agent HOME, its answers)."""
        base = private_dir(self.worker_dir(issue.identifier))
        for sub in ("home", "tmp"):
            private_dir(base / sub)
        run = ch.make_run_dir(base / "run")
        ch.write_worker_info(run, ch.WorkerInfo(
            project=self.settings.name, issue=issue.identifier, role=role.value,
            workspace=str(workspace), attempt=attempt, verify_command=self.settings.verify_command,
            iteration_cap=self.settings.agent.iteration_cap,
            review_after_execute=self.settings.review_after_execute))
        self.issues[issue.identifier] = issue
        self._write_view(issue)
        self.publish_diff(issue.identifier)
        if role is Role.GROOM:
            self._write_backlog(issue.identifier)
        return base

    def _write_backlog(self, name: str) -> None:
        """A groom worker's view of the project (``control.groom``), refreshed each tick."""
        if self.run_dir(name).is_dir():
            groom.publish_backlog(self.run_dir(name), self.issues.values(), self.store)

    async def adopt(self, observed: Observed) -> None:
        """A live worker with no run dir was started by a release before the channel: give
        it one (its commands find it by the project and issue its pane knows)."""
        workspaces = {w.name: w for w in observed.workspaces}
        issues = {i.identifier: i for i in observed.issues}
        adopted = False
        for window in worker_windows(observed.windows):
            record = observed.records.get(window.name)
            ws, issue = workspaces.get(window.name), issues.get(window.name)
            if (not window.alive or record is None or ws is None or issue is None or not ws.path
                    or self.worker_dir(window.name).is_dir()):
                continue
            self.prepare(issue, record.role, Path(ws.path), record.attempts)
            self.store.append_event("worker_adopted", issue=window.name,
                                    why="started before the worker channel existed")
            adopted = True
        if adopted:
            await self.listen()

    def _write_view(self, issue: Issue) -> None:
        run = self.run_dir(issue.identifier)
        if not run.is_dir():
            return
        view = json.dumps(issue_view(issue, self.issues), indent=1) + "\n"
        path = run / ch.ISSUE_FILE
        with contextlib.suppress(OSError):
            if path.read_text(encoding="utf-8") == view:
                return
        atomic_write_text(path, view)

    def publish(self, issues: tuple[Issue, ...]) -> None:
        """Refresh every worker's view of its issue from this tick's answer."""
        self.issues = {i.identifier: i for i in issues}
        for name in self.worker_names():
            issue = self.issues.get(name)
            if issue is not None:
                self._write_view(issue)
                record = self.store.load_record(name)
                if record is not None and record.role is Role.GROOM:
                    self._write_backlog(name)

    def worker_names(self) -> list[str]:
        try:
            return sorted(p.name for p in self.settings.paths.workers_dir.iterdir() if p.is_dir())
        except OSError:
            return []

    async def discard(self, issue: str) -> None:
        """Forget a worker's directory, having accepted anything left in its outbox."""
        await self.accept(issue)
        await self._stop_listening(issue)
        shutil.rmtree(self.worker_dir(issue), ignore_errors=True)

    # -- listening ---------------------------------------------------------------------

    async def listen(self) -> None:
        """A listener on every worker's ``ctl.sock`` (made again if its file went)."""
        names = set(self.worker_names())
        for name in list(self._servers):
            if name not in names:
                await self._stop_listening(name)
        for name in names:
            sock = self.run_dir(name) / ch.SOCKET
            held = self._servers.get(name)
            with contextlib.suppress(OSError):
                if held is not None and sock.stat().st_ino == held[1] \
                        and held[0].get_loop() is asyncio.get_running_loop():
                    continue
            await self._stop_listening(name)
            with contextlib.suppress(OSError):
                sock.unlink()
            try:
                with ch.socket_address(sock) as address:
                    server = await asyncio.start_unix_server(self._server_for(name),
                                                             path=address)
                sock.chmod(0o600)
                self._servers[name] = (server, sock.stat().st_ino)
            except OSError as exc:
                log.warning("channel_listen_failed", issue=name, error=str(exc))

    def _server_for(self, name: str) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                                                 Awaitable[None]]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve(name, reader, writer)
        return serve

    async def _stop_listening(self, name: str) -> None:
        held = self._servers.pop(name, None)
        if held is not None:
            held[0].close()
            with contextlib.suppress(Exception):
                await held[0].wait_closed()

    async def close(self) -> None:
        for name in list(self._servers):
            await self._stop_listening(name)
            with contextlib.suppress(OSError):
                (self.run_dir(name) / ch.SOCKET).unlink()

    async def _serve(self, name: str, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        """One worker says "look at my outbox"; it gets the answer to the report it names."""
        try:
            line = (await asyncio.wait_for(reader.readline(), 5.0))[:100].decode().strip()
            answers = await self.accept(name)
            answer = answers.get(line) or ch.read_answer(self.run_dir(name), line)
            if answer is not None:
                writer.write(json.dumps(answer.as_json()).encode())
                await writer.drain()
        except (OSError, TimeoutError, UnicodeDecodeError, ValueError) as exc:
            log.info("channel_request_dropped", issue=name, error=str(exc))
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        self.wake()

    # -- accepting reports --------------------------------------------------------------------

    async def accept_all(self) -> None:
        for name in self.worker_names():
            await self.accept(name)

    async def accept(self, name: str) -> dict[str, ch.Answer]:
        """Apply every unanswered report in ``name``'s outbox; their answers by id."""
        lock = self._locks.setdefault(name, asyncio.Lock())
        answers: dict[str, ch.Answer] = {}
        async with lock:
            run = self.run_dir(name)
            for path, report in ch.pending_reports(run):
                if report is None:
                    self.store.append_event("report_refused", issue=name, file=path.name[:80],
                                            why="malformed")
                    path.unlink(missing_ok=True)
                    continue
                answer = await self._accept_one(name, report)
                answers[report.id] = answer
                if report.kind in RELAY_KINDS or not answer.ok:
                    ch.write_answer(run, answer)
                else:  # news (activity, session…): nothing to keep
                    path.unlink(missing_ok=True)
        return answers

    async def _accept_one(self, name: str, report: ch.Report) -> ch.Answer:
        record = self.store.load_record(name)
        if record is None:
            return ch.Answer(report.id, False, f"ralph-dev has no worker for {name} now; stop")
        try:
            message, data = await self._apply(name, record.role, report)
        except (Refused, GroomRefused) as exc:
            return ch.Answer(report.id, False, str(exc))
        except (RalphError, OSError) as exc:
            log.warning("report_failed", issue=name, report=report.kind, error=str(exc))
            return ch.Answer(report.id, False, f"ralph-dev could not apply it: {exc}")
        pending = False
        if report.kind in RELAY_KINDS:
            failed = await self.relay.flush(only=report.id)
            pending = bool(failed)
            if pending:
                message += (f" The tracker did not answer ({failed[0][1]}); ralph-dev makes "
                            "the tracker writes when it does. Nothing is lost.")
        return ch.Answer(report.id, True, message, pending=pending, data=data)

    async def _apply(self, name: str, role: Role, report: ch.Report
                     ) -> tuple[str, dict[str, Any]]:
        fields, now = report.fields, utcnow()
        record = self.store.load_record(name)
        since = to_iso(record.started_at) if record else None
        issue = self.issues.get(name)
        match report.kind:
            case "done":
                return await self._done(name, role, fields, issue, since, report.id)
            case "blocked" | "note":
                text = strip_ansi(str(fields.get("text", ""))).strip()
                if not text:
                    raise Refused(f"the {report.kind} is empty: write what a person should know")
                self.relay.add(RelayItem(report.id, report.kind, name,
                                         {"text": text[:20000], "since": since}))
                if report.kind == "blocked":
                    self.store.update_record(name, blocked=True)
                self.store.append_event(f"worker_{report.kind}", issue=name, role=role)
                return (f"{name} is waiting for a person." if report.kind == "blocked"
                        else f"note posted on {name}."), {}
            case "plan":
                return self._plan(name, role, fields, issue, report.id)
            case "propose" | "prioritize" | "flag":
                return groom.accept(self.settings, self.store, self.relay, self.issues, name,
                                    role, report)
            case "verify_failed":
                self.store.update_record(
                    name, last_failure=f"verify failed: exit {fields.get('exit_code')}")
                self.store.append_event("verify_failed", issue=name,
                                        exit_code=fields.get("exit_code"),
                                        seconds=fields.get("duration_s"))
            case "session":
                self.store.update_record(name, last_activity=now, **ch.session_fields(fields))
            case "agent_error":
                self.store.update_record(
                    name, agent_error=str(fields.get("error", "unknown"))[:40],
                    agent_error_text=str(fields.get("text", ""))[:300],
                    agent_error_at=now, last_activity=now,
                    agent_error_streak=(record.agent_error_streak if record else 0) + 1)
                self.store.append_event("agent_api_error", issue=name,
                                        error=str(fields.get("error", "unknown"))[:40],
                                        text=str(fields.get("text", ""))[:300])
            case "iteration_cap":
                self.store.append_event("iteration_cap", issue=name,
                                        iterations=fields.get("iterations"))
            case "activity":  # a tool call, or the Stop hook sending the agent back
                count = fields.get("iterations")
                self.store.update_record(name, last_activity=now, agent_error_streak=0, **(
                    {"iterations": count} if isinstance(count, int) and count >= 0 else {}),
                    **ch.state_fields(fields, now))
                await self._snapshot(name)
            case "diff":  # the worker wants its diff now: snapshot it from outside
                self._snapshotted.pop(name, None)
                await self._snapshot(name)
            case "state":  # what the agent does now, from its own hooks
                self.store.update_record(name, **ch.state_fields(fields, now), **(
                    {"last_activity": now} if fields.get("active") is True else {}))
        return "noted", {}

    async def _snapshot(self, name: str) -> None:
        last = self._snapshotted.get(name)
        if last is not None and utcnow() - last < SNAPSHOT_EVERY:
            return
        self._snapshotted[name] = utcnow()
        try:
            await asyncio.to_thread(self.jj.snapshot, name)
        except RalphError as exc:
            log.info("snapshot_failed", issue=name, error=str(exc))
        await asyncio.to_thread(self.publish_diff, name)

    def publish_diff(self, name: str) -> None:
        with contextlib.suppress(RalphError, OSError):
            text = ch.diff_report(self.jj.change_diff(name), self.jj.conflicted_files(name))
            atomic_write_text(self.run_dir(name) / ch.DIFF_FILE, text)

    async def _done(self, name: str, role: Role, fields: Mapping[str, Any], issue: Issue | None,
                    since: str | None, report_id: str) -> tuple[str, dict[str, Any]]:
        record = self.store.load_record(name)
        if record is not None and record.done:
            return f"{name} was already reported done; nothing changed.", {"already": True}
        if issue is not None and issue.state_type in (StateType.CANCELED, StateType.DUPLICATE):
            raise Refused(f"{name} was {issue.state_name.lower()} in the tracker: stop working "
                          "on it (nothing to report)")
        if role is Role.PLAN and not (issue and issue.children) \
                and not self.relay.has(name, "plan") and not record_planned(self.store, name):
            raise Refused(f"{name} has no sub-issues yet: a plan worker first runs `ralph-dev "
                          f"worker plan {name} --file PLAN`, then `worker done`")
        summary = strip_ansi(str(fields.get("summary", ""))).strip()
        if not summary:
            raise Refused("--summary is empty: say in a few sentences what you did and how "
                          "you checked it")
        if role.may_edit:
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
        self.relay.add(RelayItem(report_id, "done", name, {
            "role": role.value, "summary": summary[:20000], "verify": verify, "since": since,
            "finished": to_iso(utcnow()), "spent": spent}))
        self.store.update_record(name, role=role, done=True, summary=summary[:20000],
                                 sent_back=None)
        self.store.append_event("worker_done", issue=name, role=role,
                                verify_exit=verify.get("exit_code") if verify else None,
                                verify_seconds=verify.get("duration_s") if verify else None,
                                tokens=spent["tokens"] if spent else None,
                                cost_usd=spent["usd"] if spent else None)
        return f"{name} reported done; summary and evidence go on the issue.", {}

    def _plan(self, name: str, role: Role, fields: Mapping[str, Any], issue: Issue | None,
              report_id: str) -> tuple[str, dict[str, Any]]:
        if role is not Role.PLAN:
            raise Refused(f"only a plan worker creates sub-issues; this is the {role.value} "
                          f"worker of {name}. If the work is too big, say so with "
                          "`ralph-dev worker note`.")
        if (issue and issue.children) or self.relay.has(name, "plan") \
                or record_planned(self.store, name):
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
        self.relay.add(RelayItem(report_id, "plan", name, {
            "entries": fields["entries"],
            "text": str(fields.get("text", ""))[:PLAN_TEXT_CHARS]}))  # read for pattern learning
        self.store.append_event("plan_accepted", issue=name, tasks=len(entries))
        return f"the plan's {len(entries)} sub-issue(s) of {name} are being created.", {}


def record_planned(store: StateStore, name: str) -> bool:
    """A plan of this worker was created (the relay made it) since it started."""
    record = store.load_record(name)
    since = record.started_at if record else None
    return any(e.get("event") == "worker_plan" and e.get("issue") == name
               and (since is None or (from_iso(e.get("time")) or since) >= since)
               for e in store.recent_events(EVENTS_SCANNED))
