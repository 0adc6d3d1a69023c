"""Each worker's own directory, and what the controller shows it there.

At each spawn the controller prepares the worker's directory
(``state_dir/workers/ISSUE/{run,home,tmp}``, 0700) and tells the worker who it is in
``run/worker.json``; each tick it refreshes ``run/issue.json`` (its view of the
issue, which its SessionStart context and ``worker feedback`` read), a groom worker's
``run/backlog.json`` (the open issues, which have a live worker, recent events), and
on request ``run/change.diff`` (jj cannot run in the sandbox). The worker's sandbox
shows it this one directory of ralph-dev's and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ralph_dev.adapters import mailbox
from ralph_dev.adapters.files import atomic_write_text, private_dir
from ralph_dev.adapters.store import StateStore, to_iso
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import RalphError
from ralph_dev.core.model import Issue, Role
from ralph_dev.core.ports import WorkerChanges
from ralph_dev.core.text import strip_ansi
from ralph_dev.hosts.bundle import kept_transcript

EVENTS_SHOWN = 60
FINISHED_SHOWN = 40
DESCRIPTION_CHARS = 1500


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


class WorkerDirs:
    """The workers' directories of one project, and the views the controller keeps there."""

    def __init__(self, settings: ProjectSettings, *, store: StateStore,
                 jj: WorkerChanges) -> None:
        self.settings = settings
        self.store = store
        self.jj = jj
        self.issues: dict[str, Issue] = {}
        """The issues as the last tick read them."""

    def worker_dir(self, issue: str) -> Path:
        return self.settings.paths.worker_dir(issue)

    def run_dir(self, issue: str) -> Path:
        return self.worker_dir(issue) / "run"

    def kept_transcript(self, issue: str, session: str) -> Path:
        return kept_transcript(self.worker_dir(issue), session)

    def names(self) -> list[str]:
        try:
            return sorted(p.name for p in self.settings.paths.workers_dir.iterdir()
                          if p.is_dir())
        except OSError:
            return []

    def prepare(self, issue: Issue, role: Role, workspace: Path, attempt: int) -> Path:
        """The worker's own dirs and its ``worker.json``/``issue.json``; returns the worker
        dir. Kept across restarts of the same issue (its agent HOME, its answers)."""
        base = private_dir(self.worker_dir(issue.identifier))
        for sub in ("home", "tmp"):
            private_dir(base / sub)
        run = mailbox.make_run_dir(base / "run")
        mailbox.write_worker_info(run, mailbox.WorkerInfo(
            project=self.settings.name, issue=issue.identifier, role=role.value,
            workspace=str(workspace), attempt=attempt, verify_command=self.settings.verify_command,
            iteration_cap=self.settings.agent.iteration_cap,
            review_after_execute=self.settings.review_after_execute))
        self.issues[issue.identifier] = issue
        self._write_view(issue)  # its change's diff comes once its agent runs (publish_diff)
        if role is Role.GROOM:
            self._write_backlog(issue.identifier)
        return base

    def discard(self, issue: str) -> None:
        shutil.rmtree(self.worker_dir(issue), ignore_errors=True)

    def publish(self, issues: Iterable[Issue]) -> None:
        """Refresh every worker's view of its issue from this tick's answer."""
        self.issues = {i.identifier: i for i in issues}
        for name in self.names():
            issue = self.issues.get(name)
            if issue is not None:
                self._write_view(issue)
                record = self.store.load_record(name)
                if record is not None and record.role is Role.GROOM:
                    self._write_backlog(name)

    def publish_diff(self, name: str) -> None:
        with contextlib.suppress(RalphError, OSError):
            text = mailbox.diff_report(self.jj.change_diff(name), self.jj.conflicted_files(name))
            atomic_write_text(self.run_dir(name) / mailbox.DIFF_FILE, text)

    def _write_view(self, issue: Issue) -> None:
        run = self.run_dir(issue.identifier)
        if not run.is_dir():
            return
        view = json.dumps(issue_view(issue, self.issues), indent=1) + "\n"
        path = run / mailbox.ISSUE_FILE
        with contextlib.suppress(OSError):
            if path.read_text(encoding="utf-8") == view:
                return
        atomic_write_text(path, view)

    def _write_backlog(self, name: str) -> None:
        run = self.run_dir(name)
        if run.is_dir():
            atomic_write_text(run / mailbox.BACKLOG_FILE,
                              json.dumps(backlog_view(self.issues.values(), self.store),
                                         indent=1) + "\n")
