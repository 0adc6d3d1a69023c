"""The project's workspace hooks (``[projects.X.hooks]``), as the jj adapter calls them.

``after_create`` prepares a new workspace before its agent starts (copy .env,
install dependencies); ``before_remove`` tidies one that is about to go. Both
run the project's own shell line (never issue text) through the verify runner:
``/bin/sh -c`` in the workspace, no secrets in the environment, a timeout, the
output appended to the worker's log (``ralph-dev logs ISSUE``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import structlog

from ralph_dev.adapters.store import StateStore
from ralph_dev.adapters.verify import VerifyOutcome, run_verify
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import WorkspaceHookFailed

log = structlog.get_logger(__name__)

NOT_RUNNABLE = (126, 127)
"""Exit codes of a command the shell could not find or run: retrying will not help."""


def _run(settings: ProjectSettings, store: StateStore, issue: str, hook: str, command: str,
         workspace: Path) -> VerifyOutcome:
    log_path = store.log_path(issue)
    env = {**os.environ, "RALPH_DEV_PROJECT": settings.name, "RALPH_DEV_ISSUE": issue,
           "RALPH_DEV_REPO": str(settings.repo), "RALPH_DEV_WORKSPACE": str(workspace)}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a", encoding="utf-8") as out:
        out.write(f"[ralph-dev] {hook} hook: {command}\n")
    outcome = run_verify(command, workspace, timeout=settings.hooks.timeout, env=env,
                         log_path=log_path)
    with log_path.open("a", encoding="utf-8") as out:
        out.write(f"[ralph-dev] {hook} hook exited {outcome.exit_code} "
                  f"after {outcome.duration_s:.1f}s\n")
    log.info("workspace_hook", hook=hook, issue=issue, exit_code=outcome.exit_code,
             seconds=outcome.duration_s)
    return outcome


def after_create(settings: ProjectSettings, store: StateStore,
                 issue: str) -> Callable[[Path], None] | None:
    """The ``after_create`` hook for ``issue``'s new workspace (None: none configured).

    A failure raises :class:`WorkspaceHookFailed`, which fails the spawn."""
    command = settings.hooks.after_create
    if not command:
        return None

    def prepare(workspace: Path) -> None:
        outcome = _run(settings, store, issue, "after_create", command, workspace)
        if outcome.ok:
            return
        last = outcome.output_tail.strip().splitlines()[-1:] or ["no output"]
        raise WorkspaceHookFailed(
            f"the after_create hook `{command}` failed in {issue}'s new workspace (exit "
            f"{outcome.exit_code}: {last[0][:200]}); the workspace was removed, the output is "
            f"in {store.log_path(issue)}; fix hooks.after_create in ralph-dev's config if "
            "it keeps failing", retryable=outcome.exit_code not in NOT_RUNNABLE)

    return prepare


def before_remove(settings: ProjectSettings, store: StateStore,
                  issue: str) -> Callable[[Path], None] | None:
    """The ``before_remove`` hook for ``issue``'s workspace (None: none configured).

    Its failure is an event, not an error: the work is safe and the workspace goes
    anyway (keeping it would only keep its disk space)."""
    command = settings.hooks.before_remove
    if not command:
        return None

    def tidy(workspace: Path) -> None:
        outcome = _run(settings, store, issue, "before_remove", command, workspace)
        if not outcome.ok:
            store.append_event("workspace_hook_failed", issue=issue, hook="before_remove",
                               exit_code=outcome.exit_code, log=str(store.log_path(issue)))

    return tidy
