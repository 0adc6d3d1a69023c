"""Who a worker is, and its view of the project: ``ralph-dev worker …`` (``reports``).

A worker talks to ralph-dev only through these commands (its skill tells it
which one ends its turn). They find their project and issue from the
environment the agent launcher set (``RALPH_DEV_PROJECT``, ``RALPH_DEV_ISSUE``,
``RALPH_DEV_ROLE``, ``RALPH_DEV_WORKSPACE``) and refuse to act on any other
issue, so a confused or manipulated agent cannot close someone else's work.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import RalphError
from ralph_dev.core.model import Role, check_identifier
from ralph_dev.core.paths import check_project_name
from ralph_dev.core.state import StateStore
from ralph_dev.core.text import strip_ansi

if TYPE_CHECKING:
    from ralph_dev.adapters.jj import JJ
    from ralph_dev.core.ports import Tracker

log = structlog.get_logger(__name__)

ENV_PROJECT = "RALPH_DEV_PROJECT"
ENV_ISSUE = "RALPH_DEV_ISSUE"
ENV_ROLE = "RALPH_DEV_ROLE"
ENV_WORKSPACE = "RALPH_DEV_WORKSPACE"


TAIL_LINES = 40
TAIL_CHARS = 4000





# --- errors --------------------------------------------------------------------


class WorkerError(RalphError):
    """A worker command refused to act; the message tells the agent what to do."""


class NotAWorker(WorkerError):
    pass


class WrongIssue(WorkerError):
    pass


class WorkerStateError(WorkerError):
    """The issue is not in a state where this command makes sense."""




# --- the worker's identity -----------------------------------------------------


@dataclass(frozen=True)
class WorkerEnv:
    """Who this process works for, as the agent launcher set it."""

    project: str
    issue: str
    role: Role = Role.EXECUTE
    workspace: Path | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> WorkerEnv | None:
        """The worker identity, ``None`` outside a worker (no ``RALPH_DEV_ISSUE``).

        Raises ``NotAWorker`` when the variables are present but unusable: a
        half-set environment is a launcher bug, not "not a worker".
        """
        environ = os.environ if environ is None else environ
        issue = environ.get(ENV_ISSUE, "").strip()
        if not issue:
            return None
        project = environ.get(ENV_PROJECT, "").strip()
        if not project:
            raise NotAWorker(
                f"{ENV_ISSUE} is set but {ENV_PROJECT} is not: this process was not started "
                "by ralph-dev's agent launcher (set both, or run the command from the worker's "
                "window)"
            )
        check_project_name(project)
        check_identifier(issue)
        role_text = environ.get(ENV_ROLE, "").strip() or Role.EXECUTE.value
        try:
            role = Role(role_text)
        except ValueError:
            known = ", ".join(r.value for r in Role)
            raise NotAWorker(
                f"{ENV_ROLE}={role_text[:40]!r} is not a worker role (expected one of {known})"
            ) from None
        workspace_text = environ.get(ENV_WORKSPACE, "").strip()
        workspace = Path(workspace_text) if workspace_text else None
        return cls(project=project, issue=issue, role=role, workspace=workspace)


def require_worker(issue: str, environ: Mapping[str, str] | None = None) -> WorkerEnv:
    """The worker identity, refusing anything but the worker's own issue."""
    check_identifier(issue)
    env = WorkerEnv.from_environ(environ)
    if env is None:
        raise NotAWorker(
            f"`ralph-dev worker` commands run inside a ralph-dev worker: {ENV_ISSUE} and "
            f"{ENV_PROJECT} are not set. To change {issue} by hand use `ralph-dev issue …`."
        )
    if env.issue != issue:
        raise WrongIssue(
            f"this worker works on {env.issue}, not {issue}: a worker may only report on its "
            f"own issue (use `ralph-dev worker note {env.issue} …` to mention {issue})"
        )
    return env


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


# --- the commands ------------------------------------------------------------------


def open_tracker(settings: ProjectSettings) -> Tracker:
    """Imported late: a hook outside a worker must not pay for the tracker's imports."""
    from ralph_dev.adapters.tracker import open_tracker as _open

    return _open(settings)


def open_jj(settings: ProjectSettings) -> JJ:
    from ralph_dev.adapters.jj import JJ

    return JJ.from_settings(settings)


@dataclass
class Worker:
    """One worker's view of its project: the tracker, the state files and jj.

    ``tracker`` and ``jj`` are injected so tests can hand in real ones built
    differently; ``jj`` is opened lazily because most commands never touch it.
    """

    settings: ProjectSettings
    env: WorkerEnv
    tracker: Tracker
    store: StateStore
    jj: JJ | None = None

    @property
    def issue(self) -> str:
        return self.env.issue

    @property
    def role(self) -> Role:
        return self.env.role

    def _jj(self) -> JJ:
        if self.jj is None:
            self.jj = open_jj(self.settings)
        return self.jj

    def workspace_dir(self) -> Path:
        """Where the verify command runs: the launcher's workspace, else jj's."""
        path = self.env.workspace or Path(self._jj().workspace_path(self.issue))
        if not path.is_dir():
            raise WorkerStateError(
                f"the workspace of {self.issue} ({path}) does not exist; the controller "
                "recreates it on the next respawn, so report with `ralph-dev worker blocked` "
                "if this persists"
            )
        return path

    def _record_since(self) -> datetime | None:
        record = self.store.load_record(self.issue)
        return record.started_at if record else None
































