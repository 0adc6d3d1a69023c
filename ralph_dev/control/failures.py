"""Where every failed action ends: retried with a backoff, held for a person, or a
swarm-wide pause — one place, so nothing loops silently and nobody is charged for a
cause outside their issue.

* A spawn or restart that fails is a failed attempt (the record's
  ``last_failure_at``): decide backs off before the next and holds the issue at
  ``timing.max_attempts``.
* A setup error is nobody's attempt: dispatch is paused swarm-wide and resumes
  by itself on the first tick the check passes again — the agent program missing
  (``setup``, checked every tick, so a spawn never even starts while it fails), jj
  missing or the repository unusable (``repository``: the tick then acts on
  nothing), the tracker refusing ralph-dev (``tracker``: a revoked key).
* A merge refused for good (several heads, files jj will not record) is held for
  a person at once, with the cause and the fix on the issue. A merge that failed
  in a way retrying may fix waits a backoff (``merge_failures``) and does not
  keep the merge slot from other issues; after ``timing.max_attempts`` such
  failures it is held too. A tracker outage is nobody's failure: it is only
  reported, and the next tick tries again.
* A change that fails the verify command on top of trunk (the verified merge lane)
  goes back to a worker of its issue; that worker's start is the attempt charged.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import structlog

from ralph_dev.adapters.store import StateStore
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import RalphError, SentBack, TrackerError, WorkspaceHookFailed
from ralph_dev.core.model import Action, Merge, Pause, Restart, Spawn
from ralph_dev.core.ports import Tracker

log = structlog.get_logger(__name__)

SETUP_PAUSE = "setup"
REPO_PAUSE = "repository"
TRACKER_PAUSE = "tracker"
HOOK_PAUSE = "hook"
"""The after_create hook cannot run (command missing): ended by a restart, which is
what reads a fixed config."""
RepoCheck = Callable[[], None]
"""Raises a :class:`RalphError` naming the fix unless jj can use the repository
(``JJ.check_repo``)."""
AgentCheck = Callable[[], None]
"""Raises a :class:`RalphError` naming the problem and its fix when workers' agent
cannot start (``agent.launch.check_agent``)."""


class FailurePolicy:
    def __init__(self, settings: ProjectSettings, *, store: StateStore, tracker: Tracker,
                 clock: Callable[[], datetime], agent_check: AgentCheck | None) -> None:
        self.settings = settings
        self.store = store
        self.tracker = tracker
        self.clock = clock
        self.agent_check = agent_check

    def _paused(self, kind: str) -> bool:
        return any(p.kind == kind for p in self.store.load_pauses())

    def _hold_swarm(self, kind: str, cause: str, fix: str) -> None:
        """Pause dispatch for a setup error, said once (the event and ``status``)."""
        if not self._paused(kind):
            self.store.set_pause(Pause(kind=kind, cause=cause, fix=fix, since=self.clock()))
            log.error("setup_error", kind=kind, error=cause)

    def config_read(self) -> None:
        """A controller that starts has read the config again: a pause only a config
        change could end (the hook's) ends here, and is set again if still broken."""
        if self._paused(HOOK_PAUSE):
            self.store.clear_pause(HOOK_PAUSE, why="the controller started with its config "
                                                   "read again")

    def check_setup(self) -> None:
        """Pause dispatch while the agent cannot start; lift the pause once it can."""
        if self.agent_check is None:
            return
        try:
            self.agent_check()
        except RalphError as exc:
            self._hold_swarm(SETUP_PAUSE, f"workers cannot start: {exc}",
                             "see the cause; dispatch resumes by itself once the agent starts")
            return
        if self._paused(SETUP_PAUSE):
            self.store.clear_pause(SETUP_PAUSE, why="the agent program is found again")

    def repository_usable(self, check: RepoCheck) -> bool:
        """While the repository pause is in force, check again (one jj call): False while
        it is still unusable, so the tick acts on nothing it cannot see."""
        if not self._paused(REPO_PAUSE):
            return True
        try:
            check()
        except RalphError:
            return False
        self.store.clear_pause(REPO_PAUSE, why="jj can read the repository again")
        return True

    def repository_failed(self, check: RepoCheck) -> bool:
        """jj failed while the world was observed: True (and the swarm paused) when the
        repository itself is unusable — jj missing, the repository gone or not a jj
        repository, the trunk bookmark deleted — which no retry of an issue fixes."""
        try:
            check()
        except RalphError as exc:
            self._hold_swarm(REPO_PAUSE, f"the repository is unusable: {exc}",
                             "see the cause; ralph-dev resumes by itself once it is fixed "
                             "(running workers are left alone)")
            return True
        return False

    def tracker_answered(self, error: TrackerError | None) -> bool:
        """A tracker that refuses ralph-dev (a revoked key, a project that is gone) is a
        setup error: paused and said once, lifted when the tracker answers again. An
        outage is only reported: nothing starts while it lasts anyway. True when the
        pauses changed."""
        if error is None:
            if self._paused(TRACKER_PAUSE):
                self.store.clear_pause(TRACKER_PAUSE, why="the tracker answers again")
                return True
        elif not error.retryable and not self._paused(TRACKER_PAUSE):
            self._hold_swarm(TRACKER_PAUSE, f"the tracker refuses ralph-dev: {error}",
                             "fix the tracker's key or settings named in the cause; "
                             "ralph-dev resumes by itself once it answers")
            return True
        return False

    async def after_failure(self, action: Action, exc: Exception) -> None:
        """Record one failed action and take it where it belongs."""
        retryable = exc.retryable if isinstance(exc, RalphError) else True
        log.warning("action_failed", action=action.kind, issue=action.issue, error=str(exc))
        self.store.append_event(
            "action_failed", issue=action.issue, action=action.kind, reason=action.reason,
            error=str(exc), retryable=retryable)
        if isinstance(action, Spawn | Restart) and isinstance(exc, WorkspaceHookFailed) \
                and not exc.retryable:
            # the project's own hook cannot run: every spawn would fail the same way, and
            # only a config change (which takes a restart) fixes it: nobody's attempt
            self._hold_swarm(HOOK_PAUSE, f"workspaces cannot be prepared: {exc}",
                             "fix hooks.after_create in ralph-dev's config, then restart "
                             "ralph-dev (the pause ends when the controller starts again)")
            self.store.update_record(action.issue, lost="the after_create hook cannot run",
                                     last_failure=str(exc)[:500])
        elif isinstance(action, Spawn | Restart):
            # a half-made spawn counts as a failed attempt: back off before the next
            self.store.update_record(action.issue, last_failure_at=self.clock(),
                                     last_failure=str(exc)[:500], lost=None)
        elif isinstance(action, Merge) and not isinstance(exc, TrackerError | SentBack):
            await self._merge_failed(action.issue, exc, retryable=retryable)

    async def _merge_failed(self, issue: str, exc: Exception, *, retryable: bool) -> None:
        if not retryable:
            await self.hold_for_person(issue, str(exc))
            return
        failures = self.store.load_record(issue)
        count = (failures.merge_failures if failures is not None else 0) + 1
        self.store.update_record(issue, merge_failures=count, merge_failed_at=self.clock(),
                                 last_failure=str(exc)[:500])
        if count >= self.settings.timing.max_attempts:
            await self.hold_for_person(
                issue, f"its merge failed {count} times, each retried after a wait; the "
                       f"last error: {exc}")

    async def hold_for_person(self, issue: str, cause: str) -> None:
        """A failure retrying cannot fix: label the issue for a person and say on it what
        happened and how to go on; decide then leaves it alone."""
        labels = self.settings.labels
        try:
            await self.tracker.add_labels(issue, [labels.user_input_needed])
            await self.tracker.comment(
                issue, f"ralph-dev stopped: {cause}\n\nWhen it is fixed, add the label "
                       f"{labels.user_feedback_given!r} and ralph-dev tries again.")
        except TrackerError as tracker_exc:  # the next tick fails the same way and retries
            log.warning("hold_failed", issue=issue, error=str(tracker_exc))
            return
        self.store.append_event("hold", issue=issue, reason=cause[:500])
