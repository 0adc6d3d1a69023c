"""Who a worker is, and its view of the project: ``ralph-dev worker …`` (``reports``).

A worker talks to ralph-dev only through these commands (its skill tells it
which one ends its turn). Who it is comes from its run directory
(``adapters.mailbox``): inside its sandbox that is ``/run/ralph-dev``, the one
directory of ralph-dev's it can see, prepared by the controller. The
environment, ``--config`` and the config file play no part: a worker command
reads nothing but its run directory and its workspace, and the controller
takes the issue and the role from its own record of whose directory a report
lies in, so no process can act for another issue.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ralph_dev.adapters import mailbox as ch
from ralph_dev.adapters.store import from_iso
from ralph_dev.core.errors import RalphError
from ralph_dev.core.model import Comment, Role, StateType, check_identifier
from ralph_dev.core.text import strip_ansi

TAIL_LINES = 40
TAIL_CHARS = 4000


class WorkerError(RalphError):
    """A worker command refused to act; the message tells the agent what to do."""


class NotAWorker(WorkerError):
    pass


class WrongIssue(WorkerError):
    pass


class WorkerStateError(WorkerError):
    """The issue is not in a state where this command makes sense."""


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""A comment's time when the tracker gave none: older than anything."""


@dataclass(frozen=True)
class IssueView:
    """The controller's last view of the worker's issue (``run/issue.json``)."""

    identifier: str
    title: str
    state_name: str
    state_type: StateType
    description: str = ""
    labels: tuple[str, ...] = ()
    parent: str | None = None
    children: tuple[str, ...] = ()
    blocked_by: tuple[str, ...] = ()
    comments: tuple[Comment, ...] = ()
    related: Mapping[str, Mapping[str, str]] | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IssueView:
        return cls(
            identifier=str(data["identifier"]), title=str(data.get("title", "")),
            state_name=str(data.get("state_name", "")),
            state_type=StateType(data.get("state_type", StateType.STARTED.value)),
            description=str(data.get("description") or ""),
            labels=tuple(str(x) for x in data.get("labels", ())),
            parent=data.get("parent"), children=tuple(data.get("children", ())),
            blocked_by=tuple(data.get("blocked_by", ())),
            comments=tuple(Comment(author=str(c.get("author", "")), body=str(c.get("body", "")),
                                   by_ralph=bool(c.get("by_ralph")), by_bot=bool(c.get("by_bot")),
                                   created_at=from_iso(c.get("created_at")) or _EPOCH)
                           for c in data.get("comments", ())),
            related=data.get("related") or {})


@dataclass(frozen=True)
class Worker:
    """This process's worker: its run directory and what the controller wrote there."""

    run_dir: Path
    info: ch.WorkerInfo

    @property
    def issue(self) -> str:
        return self.info.issue

    @property
    def role(self) -> Role:
        return Role(self.info.role)

    @property
    def workspace(self) -> Path:
        return Path(self.info.workspace)

    def view(self) -> IssueView:
        """The issue as the controller last read it from the tracker."""
        import json

        try:
            return IssueView.from_json(json.loads((self.run_dir / ch.ISSUE_FILE)
                                                  .read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise WorkerStateError(f"the controller's view of {self.issue} is unreadable "
                                   f"({exc}); try again in a minute") from exc

    def workspace_dir(self) -> Path:
        """Where the verify command runs: the worker's own workspace."""
        if not self.workspace.is_dir():
            raise WorkerStateError(
                f"the workspace of {self.issue} ({self.workspace}) does not exist; the "
                "controller recreates it on the next respawn, so report with `ralph-dev worker "
                "blocked` if this persists")
        return self.workspace

    def started_at(self) -> datetime | None:
        """When this worker's directory was prepared (its latest start)."""
        try:
            return datetime.fromtimestamp((self.run_dir / ch.WORKER_FILE).stat().st_mtime, UTC)
        except OSError:
            return None


def current_worker(environ: Mapping[str, str] | None = None) -> Worker | None:
    """The worker this process runs in; None outside any worker."""
    run_dir = ch.find_run_dir(environ)
    if run_dir is None:
        return None
    try:
        return Worker(run_dir, ch.read_worker_info(run_dir))
    except ch.ChannelError as exc:
        raise NotAWorker(str(exc)) from exc


def require_worker(issue: str, environ: Mapping[str, str] | None = None) -> Worker:
    """The worker, refusing anything but its own issue."""
    check_identifier(issue)
    worker = current_worker(environ)
    if worker is None:
        raise NotAWorker(
            f"`ralph-dev worker` commands run inside a ralph-dev worker (its run directory "
            f"{ch.RUN_MOUNT} is not here). To change {issue} by hand use `ralph-dev issue …`.")
    if worker.issue != issue:
        raise WrongIssue(
            f"this worker works on {worker.issue}, not {issue}: a worker may only report on "
            f"its own issue (use `ralph-dev worker note {worker.issue} …` to mention {issue})")
    return worker


def refuse_inside_a_worker(command: str, environ: Mapping[str, str] | None = None) -> None:
    """People's commands are not a worker's: refuse them inside one, naming the way out."""
    if ch.find_run_dir(environ) is not None:
        raise WorkerError(
            f"`ralph-dev {command}` is a person's command and does not run inside a worker; "
            "report through `ralph-dev worker done/blocked/note` instead")


# --- text hygiene ------------------------------------------------------------------


def clean_text(text: str) -> str:
    """Text with terminal escapes and control characters removed (newlines and tabs kept).

    Issue text and command output end up in an agent's context and in tracker
    comments; escape sequences there are noise at best and terminal tricks at worst.
    """
    return strip_ansi(text)


def one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(clean_text(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def clip_output(text: str, lines: int = TAIL_LINES, chars: int = TAIL_CHARS) -> str:
    kept = clean_text(text).rstrip("\n").split("\n")[-lines:]
    out = "\n".join(kept)
    if len(out) > chars:
        out = "…" + out[-(chars - 1):]
    return out
