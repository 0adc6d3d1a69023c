"""Where every failed action ends: retried with a backoff, held for a person, or a
swarm-wide pause — one place, so nothing loops silently and nobody is charged for a
cause outside their issue.

* A spawn or restart that fails is a failed attempt (the record's
  ``last_failure_at``): decide backs off before the next and holds the issue at
  ``timing.max_attempts``.
* A setup error (the agent program missing) is nobody's attempt: dispatch is
  paused swarm-wide (``Pause(kind="setup")``) and resumes by itself on the first
  tick the check passes again. The check runs every tick, so a spawn never even
  starts while it fails.
* A merge refused for good (several heads, files jj will not record) is held for
  a person at once, with the cause and the fix on the issue. A merge that failed
  in a way retrying may fix waits a backoff (``merge_failures``) and does not
  keep the merge slot from other issues; after ``timing.max_attempts`` such
  failures it is held too. A tracker outage is nobody's failure: it is only
  reported, and the next tick tries again.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import structlog

from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import RalphError, TrackerError
from ralph_dev.core.model import Action, Merge, Pause, Restart, Spawn
from ralph_dev.core.ports import Tracker
from ralph_dev.core.state import StateStore

log = structlog.get_logger(__name__)

SETUP_PAUSE = "setup"
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

    def check_setup(self) -> None:
        """Pause dispatch while the agent cannot start; lift the pause once it can."""
        if self.agent_check is None:
            return
        paused = any(p.kind == SETUP_PAUSE for p in self.store.load_pauses())
        try:
            self.agent_check()
        except RalphError as exc:
            if not paused:
                self.store.set_pause(Pause(
                    kind=SETUP_PAUSE, cause=f"workers cannot start: {exc}",
                    fix="see the cause; dispatch resumes by itself once the agent starts",
                    since=self.clock()))
                log.error("setup_error", error=str(exc))
            return
        if paused:
            self.store.clear_pause(SETUP_PAUSE, why="the agent program is found again")

    async def after_failure(self, action: Action, exc: Exception) -> None:
        """Record one failed action and take it where it belongs."""
        retryable = exc.retryable if isinstance(exc, RalphError) else True
        log.warning("action_failed", action=action.kind, issue=action.issue, error=str(exc))
        self.store.append_event(
            "action_failed", issue=action.issue, action=action.kind, reason=action.reason,
            error=str(exc), retryable=retryable)
        if isinstance(action, Spawn | Restart):
            # a half-made spawn counts as a failed attempt: back off before the next
            self.store.update_record(action.issue, last_failure_at=self.clock(),
                                     last_failure=str(exc)[:500], lost=None)
        elif isinstance(action, Merge) and not isinstance(exc, TrackerError):
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
