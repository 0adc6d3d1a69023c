"""One controller tick: observe → decide → act.

Level-triggered: each tick re-reads the tracker, tmux (one call) and jj, plus
ralph-dev's own worker records, and asks the pure ``decide`` what to do.
Nothing important is kept in memory between ticks, so killing the controller
at any moment and starting it again converges to the same place.

Failures are separated the controller-runtime way: a tracker that cannot be
read skips dispatch for this tick (workers keep running); an action that
fails is recorded as an event and simply proposed again by a later tick.
How an action changes the world and the worker records is the executor
contract that ``core.decide`` relies on (``decide.EXECUTOR_CONTRACT``);
tests/test_executor_contract.py runs :meth:`Controller.act` against it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import structlog

from ralph_dev.adapters.store import StateStore, utcnow
from ralph_dev.control import admission, groom, patterns, workspace_hooks
from ralph_dev.control.agent_waits import AgentWaits
from ralph_dev.control.beating import while_beating
from ralph_dev.control.channel import Channel
from ralph_dev.control.costs import Spending
from ralph_dev.control.failures import AgentCheck, FailurePolicy
from ralph_dev.control.merging import MergeLane
from ralph_dev.control.metrics import TickHistogram
from ralph_dev.control.observe import observe
from ralph_dev.control.tripwires import Tripwires
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.decide import decide
from ralph_dev.core.errors import RalphError, TrackerError
from ralph_dev.core.model import (
    Action,
    Complete,
    Forget,
    Hold,
    Issue,
    Kill,
    Merge,
    Nudge,
    Observed,
    Plan,
    Reap,
    RelayFeedback,
    Restart,
    Resume,
    Spawn,
    StateType,
    Window,
    worker_windows,
)
from ralph_dev.core.paths import config_file
from ralph_dev.core.ports import (
    AgentLauncher,
    Panes,
    PullRequests,
    Repository,
    Tracker,
)

log = structlog.get_logger(__name__)

SPAWN_UNFINISHED = "its start did not finish (the controller stopped mid-spawn)"

FEEDBACK_MESSAGE = (
    "ralph-dev: a person left feedback on your issue. Run `ralph-dev worker feedback "
    "{issue}` to read it, then carry on with it in mind."
)
"""Typed into a live worker's pane: fixed text plus the checked identifier, never issue text."""

_UNBLOCKING = (Merge, Forget, Complete, Reap, Kill, Resume, Hold)
"""Actions whose success may let another action go at once (a merge frees dependents,
a reaped or killed window or a lifted hold frees a respawn)."""


@dataclass
class TickResult:
    tick: int
    plan: Plan
    observed: Observed
    failures: list[tuple[Action, str]] = field(default_factory=list)

    @property
    def unblocked_work(self) -> bool:
        failed = {id(a) for a, _ in self.failures}
        return any(isinstance(a, _UNBLOCKING) and id(a) not in failed
                   for a in self.plan.actions)


def human_feedback(issue: Issue) -> str | None:
    """Comments people wrote after ralph-dev last spoke: what a resumed worker must read."""
    newest: list[str] = []
    for comment in reversed(issue.comments):
        if comment.by_bot:
            continue  # an integration's words ("GitHub: Linked PR #42") are not a person's
        if comment.by_ralph:
            break
        newest.append(f"{comment.author} ({comment.created_at:%Y-%m-%d %H:%M}): {comment.body}")
    return "\n\n".join(reversed(newest)) or None


class Controller:
    """Owns one tick; adapters are injected (``control.wiring`` builds the real ones)."""

    def __init__(
        self,
        settings: ProjectSettings,
        *,
        tracker: Tracker,
        tmux: Panes,
        jj: Repository,
        launcher: AgentLauncher,
        pull_requests: PullRequests,
        store: StateStore | None = None,
        clock: Callable[[], datetime] = utcnow,
        agent_check: AgentCheck | None = None,
    ) -> None:
        self.settings = settings
        self.tracker = tracker
        self.tmux = tmux
        self.jj = jj
        self.launcher = launcher
        self.store = store or StateStore(settings.paths)
        self.clock = clock
        self.tick_number = 0
        self.stopping = False
        self.merges = MergeLane(settings, jj=jj, tracker=tracker, store=self.store,
                                pull_requests=pull_requests, beat=self._beat_while)
        self.failures = FailurePolicy(settings, store=self.store, tracker=tracker, clock=clock,
                                      agent_check=agent_check)
        self.failures.config_read()
        self.agent_waits = AgentWaits(store=self.store, tmux=tmux, clock=clock,
                                      outage_wait=timedelta(seconds=settings.timing.outage_wait))
        self.spending = Spending(settings, self.store, clock)
        self.tripwires = Tripwires(settings, self.store, config=config_file(), clock=clock)
        self.channel = Channel(settings, store=self.store, tracker=tracker, jj=jj.workspaces)
        self.tick_seconds = TickHistogram()  # published in the heartbeat for /metrics

    def _end_pauses_due(self) -> None:
        """A pause with a stated end (a usage limit's reset) ends by itself then."""
        now = self.clock()
        for pause in self.store.load_pauses():
            if pause.until is not None and pause.until <= now:
                self.store.clear_pause(pause.kind, why="its stated end has passed")

    async def _hear_workers(self) -> None:
        """Workers' reports first (written while we were busy or stopped), then the
        tracker writes they still owe (each item waits its own backoff)."""
        await self.channel.listen()
        await self.channel.accept_all()
        await self.channel.relay.flush()

    def _beat_while(self, acting: str) -> None:
        # the whole beat, not a part of it: /metrics reads tick_seconds from the file
        self.store.write_heartbeat(tick=self.tick_number, acting=acting,
                                   tick_seconds=self.tick_seconds.as_json())

    # -- tick ---------------------------------------------------------------

    async def tick(self) -> TickResult:
        self.tick_number += 1
        started = time.monotonic()
        structlog.contextvars.bind_contextvars(tick=self.tick_number)
        try:
            try:
                await self.merges.recheck_red_trunk()
            except (RalphError, OSError) as exc:
                self.store.append_event("trunk_recheck_failed", error=str(exc))
            self._end_pauses_due()
            await self._hear_workers()
            self.failures.check_setup()
            admission.admit(self.settings, self.store, self.clock)
            self.agent_waits.pause_for_errors()
            try:
                if not self.failures.repository_usable(self.jj.trunk.check_repo):
                    return self._idle_tick()
                observed, tracker_error = await observe(
                    self.tracker, self.tmux, self.jj.workspaces, self.store,
                    agent_aware=self.settings.agent.runner == "claude",
                    relaying=self.channel.relay.owed())
            except RalphError:  # jj could not list the workspaces: is it the repository?
                if self.failures.repository_failed(self.jj.trunk.check_repo):
                    return self._idle_tick()
                raise
            if self.failures.tracker_answered(tracker_error):  # a pause began or ended now
                observed = dataclasses.replace(observed, pauses=self.store.load_pauses())
            await self._upkeep(observed)
            if tracker_error is None:
                self.channel.publish(observed.issues)
                await self.channel.adopt(observed)
                patterns.settle(self.settings, self.store, observed, self.clock())
            await self.agent_waits.continue_waiting(observed.windows)
            if tracker_error is not None:
                self.store.append_event("tracker_unavailable", error=str(tracker_error))
            plan = decide(observed, self.settings, self.clock())
            result = TickResult(self.tick_number, plan, observed)
            await self._carry_out(plan, observed, result)
            if plan.open_groom and not self.stopping:
                await groom.open_run(self.settings, self.tracker, self.store, plan.open_groom)
            self.tick_seconds.observe(time.monotonic() - started)
            self.write_heartbeat(observed, plan)
            return result
        finally:
            structlog.contextvars.unbind_contextvars("tick")

    async def _upkeep(self, observed: Observed) -> None:
        """Duties beside the plan — logs kept small, spend counted and capped, tripwires
        watched; a failure in one is logged and never fails the tick."""
        for window in observed.windows:
            if window.alive and window.name in observed.records:
                self.store.rotate_log(window.name)
        try:
            await self._stop_over_budget(observed)
            for name, why in (await self.tripwires.check(observed)).items():
                await self._stop_and_hold(name, why, observed)  # a suspect: it may be the one
        except (RalphError, OSError) as exc:
            log.warning("upkeep_failed", error=str(exc))

    async def _stop_over_budget(self, observed: Observed) -> None:
        """Count what the agents spent since the last tick; stop and hold a worker whose
        issue is past its budget (once: a held issue is left alone)."""
        held = self.settings.labels.user_input_needed.casefold()
        labels = {i.identifier: {n.casefold() for n in i.labels} for i in observed.issues}
        for name, why in self.spending.account(observed.records):
            if held in labels.get(name, {held}):
                continue
            self.store.append_event("budget_exceeded", issue=name, why=why)
            await self._stop_and_hold(
                name, f"{name} is over its budget: {why}. Its worker was stopped; its work "
                      "stays in its workspace. Raise the budget in ralph-dev's config first",
                observed)

    async def _stop_and_hold(self, name: str, why: str, observed: Observed) -> None:
        """Stop the issue's worker (its work stays in its workspace) and hold it for a
        person, saying why."""
        self._kill_windows(name, observed)
        await self.failures.hold_for_person(name, why)

    def _idle_tick(self) -> TickResult:
        """A tick that cannot see the repository acts on nothing (a workspace jj cannot
        list is not a workspace that is gone); it still beats, so the daemon sees it."""
        observed, plan = Observed(tracker_ok=False), Plan(())
        self.write_heartbeat(observed, plan)
        return TickResult(self.tick_number, plan, observed)

    async def _carry_out(self, plan: Plan, observed: Observed, result: TickResult) -> None:
        """Actions in plan order, except that issues being merged go last: a merge takes
        jj a while, and new workers should not wait for it (merging holds no slot). An
        issue's own chain keeps its order and stops at its first failing action."""
        failed_issues: set[str] = set()
        by_id = {issue.identifier: issue for issue in observed.issues}
        merging = {a.issue for a in plan.actions if isinstance(a, Merge)}
        ordered = sorted(plan.actions, key=lambda a: a.issue in merging)  # stable
        paused = False  # a failure this tick paused the swarm: start nothing more
        for action in ordered:
            if self.stopping:
                break
            if action.issue in failed_issues or (paused and isinstance(action, Spawn | Restart)):
                continue  # the rest of this issue's chain waits for a later tick
            if isinstance(action, Merge) and self.merges.trunk_red():
                failed_issues.add(action.issue)  # a merge earlier this tick turned trunk red
                continue
            try:
                self.write_heartbeat(observed, plan, acting=action.kind)
                self.tripwires.controller_acted(action.issue)
                await self.act(action, by_id.get(action.issue), observed)
            except (RalphError, OSError) as exc:
                failed_issues.add(action.issue)
                result.failures.append((action, str(exc)))
                await self.failures.after_failure(action, exc)
                paused = bool(self.store.load_pauses())
            else:
                details = {k: v for k, v in action.details().items()
                           if v not in (None, "", False)}
                self.store.append_event(action.kind, issue=action.issue, reason=action.reason,
                                        **details)

    def write_heartbeat(self, observed: Observed, plan: Plan, *,
                        acting: str | None = None) -> None:
        live = [w for w in worker_windows(observed.windows) if w.alive]
        self.store.write_heartbeat(
            tick=self.tick_number,
            workers=len(live),
            issues=len(observed.issues),
            actions=len(plan.actions),
            tracker_ok=observed.tracker_ok,
            tracker_usage=self.tracker.usage(),
            acting=acting,
            tick_seconds=self.tick_seconds.as_json(),
        )

    # -- act ----------------------------------------------------------------

    async def act(self, action: Action, issue: Issue | None, observed: Observed) -> None:
        """Carry out one action (the executor contract: ``decide.EXECUTOR_CONTRACT``)."""
        log.info("act", action=action.kind, issue=action.issue, reason=action.reason)
        labels = self.settings.labels
        match action:
            case Spawn() | Restart():
                if isinstance(action, Restart):
                    self._kill_windows(action.issue, observed)
                    self.store.update_record(action.issue, last_failure_at=self.clock(),
                                             last_failure=action.reason)
                await self._spawn(action, issue)
            case Nudge():
                for window in self._windows(action.issue, observed, alive=True):
                    await asyncio.to_thread(self.tmux.send_text, window.pane_id, action.message)
                self.store.update_record(action.issue, nudged_at=self.clock())
            case Reap():
                self._kill_windows(action.issue, observed)
                self.store.update_record(action.issue, last_failure_at=self.clock(),
                                         last_failure=action.reason)
            case Kill():
                self._kill_windows(action.issue, observed)
            case Merge():
                await self.merges.merge(action, issue)
            case Forget():
                # in PR mode the change lives on under its pushed bookmark, not in trunk
                keep = action.keep_bookmark or self.settings.merge.mode == "pr"
                await self.channel.discard(action.issue)
                await while_beating(
                    self._beat_while, "forget", self.jj.workspaces.forget, action.issue,
                    keep_bookmark=keep,
                    before_remove=workspace_hooks.before_remove(self.settings, self.store,
                                                                action.issue))
                self.store.delete_record(action.issue)
            case Hold():
                await self.tracker.add_labels(action.issue, [labels.user_input_needed])
                await self.tracker.comment(action.issue, action.comment or action.reason)
            case Complete():
                await self.tracker.set_state(action.issue, type=StateType.COMPLETED)
            case RelayFeedback():
                await self._relay_feedback(action, issue, observed)
            case Resume():
                await self.tracker.remove_labels(
                    action.issue, [labels.user_feedback_given, labels.user_input_needed])
                self.store.update_record(action.issue, attempts=0, blocked=False,
                                         last_failure_at=None, nudged_at=None,
                                         merge_failures=0, merge_failed_at=None)
            case _:
                raise RalphError(f"unknown action {action!r}")

    def _windows(self, name: str, observed: Observed, *, alive: bool | None = None) -> list[Window]:
        return [w for w in observed.windows
                if w.name == name and (alive is None or w.alive == alive)]

    def _kill_windows(self, name: str, observed: Observed) -> None:
        for window in self._windows(name, observed):
            self.tmux.kill_window(window.window_id)

    async def _relay_feedback(self, action: RelayFeedback, issue: Issue | None,
                              observed: Observed) -> None:
        labels = self.settings.labels
        for window in self._windows(action.issue, observed, alive=True):
            await asyncio.to_thread(self.tmux.send_text, window.pane_id,
                                    FEEDBACK_MESSAGE.format(issue=action.issue))
        await self.tracker.remove_labels(
            action.issue, [labels.user_feedback_given, labels.user_input_needed])
        held = issue is not None and labels.user_input_needed.casefold() in {
            name.casefold() for name in issue.labels}
        if held:
            # a person answered a hold: like Resume, the attempt count starts over, or a
            # worker that asked on its last attempt and then died would be held again
            # with the answer ignored
            self.store.update_record(action.issue, blocked=False, attempts=0,
                                     last_failure_at=None, nudged_at=None)
        else:
            self.store.update_record(action.issue, blocked=False)

    def _resumable(self, action: Spawn | Restart) -> str | None:
        """The Claude Code session a new start of this issue's worker continues: the
        last one of the same role whose transcript is still there (else a fresh start,
        said in the events)."""
        record = self.store.load_record(action.issue)
        if record is None or record.session_id is None or record.role is not action.role:
            return None
        if record.transcript is None or not Path(record.transcript).is_file():
            self.store.append_event("session_fresh", issue=action.issue,
                                    why="the earlier session's transcript is gone")
            return None
        return record.session_id

    async def _spawn(self, action: Spawn | Restart, issue: Issue | None) -> None:
        if issue is None:
            raise TrackerError(f"{action.issue}: not in the tracker's answer this tick")
        resume = self._resumable(action)
        workspace: Path = await while_beating(
            self._beat_while, "spawn", self.jj.workspaces.add_workspace, action.issue,
            after_create=workspace_hooks.after_create(self.settings, self.store, action.issue))
        record = self.store.update_record(
            action.issue, role=action.role, attempts=action.attempt, started_at=self.clock(),
            done=False, blocked=False, nudged_at=None, iterations=0,
            # until its window is open: a controller stopped (killed, frozen) mid-spawn is
            # a cause outside the issue, and the next start charges nothing for it
            lost=SPAWN_UNFINISHED,
        )
        if issue.state_type in (StateType.UNSTARTED, StateType.BACKLOG, StateType.TRIAGE):
            await self.tracker.set_state(action.issue, type=StateType.STARTED)
        worker_dir = self.channel.prepare(issue, action.role, workspace, action.attempt)
        await self.channel.listen()
        launch = self.launcher(issue, action.role, workspace,
                               action.model or self.settings.agent.model,
                               attempt=action.attempt, feedback=human_feedback(issue),
                               resume_session=resume, worker_dir=worker_dir,
                               sent_back=record.sent_back if action.role.may_edit else None)
        try:
            await asyncio.to_thread(
                self.tmux.open_window, action.issue, cwd=launch.cwd, command=launch.argv,
                environment=launch.env, log_file=self.store.log_path(action.issue),
            )
        except BaseException:
            launch.discard_secrets()
            raise
        self.store.update_record(action.issue, lost=None)
        log.info("spawned", issue=action.issue, role=record.role.value, attempt=record.attempts)
