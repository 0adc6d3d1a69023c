"""The project's workspace hooks (``[projects.X.hooks]``), run where the agent works.

``after_create`` prepares a new workspace before its agent starts (copy .env,
install dependencies); ``before_remove`` tidies one that is about to go. Both
run the project's own shell line (never issue text) through the verify runner:
``/bin/sh -c`` in the workspace, no secrets in the environment, a timeout, the
output appended to the worker's log (``ralph-dev logs ISSUE``). On this host that
is the controller's workspace; on a cluster it is the attempt's workspace on its
host (``hosts.node.worker``), whose log the controller reads from there: a
worker's ``npm ci`` is useless anywhere else.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from ralph_dev.adapters.verify import VerifyOutcome, run_verify
from ralph_dev.core.config import ProjectSettings, WorkspaceHooks
from ralph_dev.core.errors import WorkspaceHookFailed
from ralph_dev.core.ports import WorkspaceHook

log = structlog.get_logger(__name__)

NOT_RUNNABLE = (126, 127)
"""Exit codes of a command the shell could not find or run: retrying will not help."""

HookFailed = Callable[[str, int, Path], None]
"""Told of a ``before_remove`` that failed: (issue, exit code, its log)."""


@dataclass(frozen=True)
class Hooks:
    """The project's hook lines for one issue's workspaces, with where their output
    goes: plain data, so a cluster's host receives it with the attempt's spec."""

    config: WorkspaceHooks
    project: str
    repo: str
    issue: str
    log_path: Path

    @classmethod
    def of(cls, settings: ProjectSettings, issue: str, log_path: Path) -> Hooks:
        return cls(settings.hooks, settings.name, str(settings.repo), issue, log_path)

    def _run(self, hook: str, command: str, workspace: Path) -> VerifyOutcome:
        env = {**os.environ, "RALPH_DEV_PROJECT": self.project, "RALPH_DEV_ISSUE": self.issue,
               "RALPH_DEV_REPO": self.repo, "RALPH_DEV_WORKSPACE": str(workspace)}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a", encoding="utf-8") as out:
            out.write(f"[ralph-dev] {hook} hook: {command}\n")
        outcome = run_verify(command, workspace, timeout=self.config.timeout, env=env,
                             log_path=self.log_path)
        with self.log_path.open("a", encoding="utf-8") as out:
            out.write(f"[ralph-dev] {hook} hook exited {outcome.exit_code} "
                      f"after {outcome.duration_s:.1f}s\n")
        log.info("workspace_hook", hook=hook, issue=self.issue, exit_code=outcome.exit_code,
                 seconds=outcome.duration_s)
        return outcome

    def after_create(self) -> WorkspaceHook | None:
        """The ``after_create`` hook for the issue's new workspace (None: none
        configured). A failure raises :class:`WorkspaceHookFailed`, which fails the
        spawn."""
        command = self.config.after_create
        if not command:
            return None

        def prepare(workspace: Path) -> None:
            outcome = self._run("after_create", command, workspace)
            if outcome.ok:
                return
            last = outcome.output_tail.strip().splitlines()[-1:] or ["no output"]
            raise WorkspaceHookFailed(
                f"the after_create hook `{command}` failed in {self.issue}'s new workspace "
                f"(exit {outcome.exit_code}: {last[0][:200]}); the workspace was removed, "
                f"the output is in {self.log_path}; fix hooks.after_create in ralph-dev's "
                "config if it keeps failing", retryable=outcome.exit_code not in NOT_RUNNABLE)

        return prepare

    def before_remove(self, failed: HookFailed) -> WorkspaceHook | None:
        """The ``before_remove`` hook for the issue's workspace (None: none configured).
        Its failure is told to ``failed``, not raised: the work is safe and the
        workspace goes anyway (keeping it would only keep its disk space)."""
        command = self.config.before_remove
        if not command:
            return None

        def tidy(workspace: Path) -> None:
            outcome = self._run("before_remove", command, workspace)
            if not outcome.ok:
                failed(self.issue, outcome.exit_code, self.log_path)

        return tidy
