"""The actuator: the one place that carries out ``decide``'s actions.

Nothing else outside adapters/, hosts/ and cli/ writes to the tracker or ends a
worker: a hold, a comment, a state change, a worker's report written back, a window
closed — all of it happens here, for an action ``decide`` emitted with its reason,
with every choice already made (``core.decide.orders``: which session a start
resumes, whether the issue moves, what comes back). Workers are started, typed to
and ended through the one worker-host port, never asking where they run. What each
action leaves in the worker record is what the action itself says
(``Action.record_changes``): the actuator writes exactly that when the action
succeeds, so the contract ``decide`` relies on is enforced by construction.

A failed action never fails the tick: its error is classified by the one failure
policy (``core.policy.verdict``) into facts on the record — a backoff, a pause's
cause, a hold a person must see — which the next tick's ``decide`` acts on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from ralph_dev.adapters.accounts import AccountPauses, KeyProbe
from ralph_dev.adapters.pattern_store import remember_safely
from ralph_dev.adapters.store import StateStore, from_iso, utcnow
from ralph_dev.adapters.writebacks import WriteBackItem, WriteBackQueue
from ralph_dev.control.loop.heartbeat import while_beating
from ralph_dev.control.loop.intake import Intake
from ralph_dev.control.loop.merging import MergeLane, MergeOutcome
from ralph_dev.control.loop.worker_dirs import WorkerDirs
from ralph_dev.core import writeback as wb
from ralph_dev.core.actions import (
    STOPPED,
    Action,
    Adopt,
    Complete,
    Continue,
    EndPause,
    Forget,
    Hold,
    Kill,
    Merge,
    Nudge,
    OpenGroom,
    PassFeedback,
    PauseSwarm,
    Plan,
    ProbeAccount,
    Reap,
    Redo,
    Restart,
    Resume,
    SendBack,
    Spawn,
    Stop,
    Tell,
    TrunkVerified,
    VerifyMerge,
    VerifyTrunk,
    Waited,
    WriteBack,
)
from ralph_dev.core.agent_profiles import role_model
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.environment import ATTEMPT_VAR
from ralph_dev.core.errors import (
    HostUnavailable,
    LaneStale,
    RalphError,
    TrackerError,
    TrackerUnavailable,
    WorkspaceHookFailed,
)
from ralph_dev.core.model import (
    Ended,
    Issue,
    NewIssue,
    Observed,
    Pause,
    Role,
    StateType,
    Window,
    human_feedback,
)
from ralph_dev.core.patterns import plan_text
from ralph_dev.core.policy import Blame, Failure, verdict
from ralph_dev.core.policy import blame as blame_for
from ralph_dev.core.ports import (
    AgentLauncher,
    Tracker,
    WorkerHost,
    WorkerMailboxes,
)

log = structlog.get_logger(__name__)

SPAWN_UNFINISHED = "its start did not finish (the controller stopped mid-spawn)"

FEEDBACK_MESSAGE = (
    "ralph-dev: a person left feedback on your issue. Run `ralph-dev worker feedback "
    "{issue}` to read it, then carry on with it in mind."
)
"""Typed into a live worker's pane: fixed text plus the checked identifier, never issue text."""

CONTINUE = ("The model API is available again (ralph-dev paused the swarm while it was "
            "not). Continue the task where you left off.")
DISMISS_SETTLE_S = 0.5
"""An Escape followed at once by text reads as Alt+key to a TUI."""

OWN_EVENTS = (PauseSwarm, EndPause, WriteBack, VerifyTrunk, OpenGroom, Continue, Adopt,
              VerifyMerge, SendBack, TrunkVerified, ProbeAccount)
"""Actions whose carrying out writes its own, more telling event (``swarm_paused``,
``relayed``, ``trunk_green``…) instead of the action's."""

GROOM_TITLE = "Groom the backlog"
GROOM_DESCRIPTION = (
    "A groom run ralph-dev opened by itself ({why}). Its worker reads the open issues, "
    "trunk and recent events, and proposes issues (they wait in a backlog state with the "
    "label {proposed!r}), lowers or sets priorities and flags duplicates or stale issues, "
    "each with a one-line reason in a comment. It is completed when the run ends.")


def event_details(action: Action) -> dict[str, object]:
    """An action's fields for its event, leaving out the unset ones (None, "", False) but
    never a number: a pane's exit status 0 is a fact a person reads."""
    return {k: v for k, v in action.details().items()
            if v is not None and v != "" and v is not False}


class Actuator:
    """Carries out one project's actions through its ports."""

    def __init__(self, settings: ProjectSettings, *, tracker: Tracker, host: WorkerHost,
                 launcher: AgentLauncher, store: StateStore,
                 dirs: WorkerDirs, intake: Intake, server: WorkerMailboxes,
                 merges: MergeLane, writebacks: WriteBackQueue,
                 clock: Callable[[], datetime], beat: Callable[[str], None],
                 acted_on: Callable[[str], None] = lambda issue: None,
                 accounts: AccountPauses | None = None,
                 key_probe: KeyProbe | None = None) -> None:
        self.settings = settings
        self.tracker = tracker
        self.host = host
        """Where workers run (this host, or others): the actuator never asks which."""
        self.launcher = launcher
        self.store = store
        self.dirs = dirs
        self.intake = intake
        self.server = server
        self.merges = merges
        self.writebacks = writebacks
        self.clock = clock
        self.beat = beat
        self.acted_on = acted_on
        """Told before each action on an issue (the tripwires see its workspace afresh)."""
        self.accounts = accounts
        """The account the project's agents run on: its pauses are every project's."""
        self.key_probe = key_probe
        """Asks the model API for the account's API-key limits (``ProbeAccount``)."""
        self.writer = WriteBackWriter(settings, tracker=tracker, store=store,
                                      writebacks=writebacks, clock=clock)
        self._beside: set[asyncio.Future[None]] = set()
        """Work a start need not wait for, running beside the loop (held here so it is
        not collected before it ends)."""
        self._diffs_due: list[str] = []
        """Workers started by this plan whose change is yet to be shown them."""

    # -- a plan ---------------------------------------------------------------------------

    async def carry_out(self, plan: Plan, observed: Observed,
                        stopping: Callable[[], bool] = lambda: False,
                        before: Callable[[Action], None] = lambda action: None,
                        ) -> list[tuple[Action, str]]:
        """Actions in plan order (``decide`` puts them in the order they go). An issue's
        own chain stops at its first failing action. Returns the actions that failed,
        with why."""
        failures: list[tuple[Action, str]] = []
        failed_issues: set[str] = set()
        by_id = {issue.identifier: issue for issue in observed.issues}
        no_starts = False  # a failure this plan showed every start would fail the same way
        try:
            for action in plan.actions:
                if stopping():
                    break
                if failed_issues.intersection(action.issues()) \
                        or (no_starts and isinstance(action, Spawn | Restart)):
                    continue  # the rest of this issue's chain waits for a later tick
                before(action)
                try:
                    await self.act(action, by_id.get(action.issue), observed)
                except (RalphError, OSError) as exc:
                    failed_issues.update(action.issues())
                    failures.append((action, str(exc)))
                    no_starts |= self.failed(action, exc)
        finally:
            self._publish_diffs()
        return failures

    def _publish_diffs(self) -> None:
        """The change so far of each worker this plan started (``worker diff`` asks for a
        fresh one; this is what it reads should the controller be busy), beside the loop
        once the plan's starts are done: two jj calls each, which the next start in the
        same plan would otherwise compete with for the host's cores."""
        names, self._diffs_due = self._diffs_due, []

        def publish() -> None:
            for name in names:
                self.dirs.publish_diff(name)

        if names:  # in a thread from now on, though the loop stops after this plan
            self._hold(asyncio.get_running_loop().run_in_executor(None, publish))

    async def act(self, action: Action, issue: Issue | None, observed: Observed) -> None:
        """Carry out one action; on success, its record changes and its event."""
        log.info("act", action=action.kind, issue=action.issue, reason=action.reason)
        for name in action.touches():
            self.acted_on(name)
        learned = await self._do(action, issue, observed)
        if action.record_deleted:
            self.store.delete_record(action.issue)
        elif changes := action.record_changes(self.clock()):
            self.store.update_record(action.issue, **changes)
        if not isinstance(action, OWN_EVENTS):
            self.store.append_event(action.kind, issue=action.issue, reason=action.reason,
                                    **event_details(action), **learned)

    async def _do(self, action: Action, issue: Issue | None, observed: Observed
                  ) -> dict[str, object]:
        """Carry out the action; what it learned that its event should say (the node its
        host placed a worker on)."""
        labels = self.settings.labels
        match action:
            case Spawn() | Restart():
                ended = await self._end_windows(action, observed) \
                    if isinstance(action, Restart) else None
                return await self._spawn(action, issue, ended)
            case Nudge():
                for window in self._windows(action.issue, observed, alive=True):
                    await asyncio.to_thread(self.host.send_text, window.pane_id, action.message)
            case Reap() | Kill():
                await self._end_windows(action, observed)
            case Stop():
                with contextlib.suppress(RalphError):  # what its agent wrote is recorded
                    await asyncio.to_thread(self.host.changes.snapshot, action.issue)
                await self._end_windows(action, observed)
            case Merge():
                if action.fetch_attempt:
                    await self._bring_in(action.issue, action.fetch_attempt)
                await self._lane(action, await self.merges.merge(action, issue))
            case VerifyMerge():
                await self._lane(action, await self.merges.verify_merge(action, self._bring_in))
            case SendBack():
                await self._lane(action, self.merges.send_back(action))
            case TrunkVerified():
                await self._lane(action, await self.merges.trunk_verified(action))
            case Forget():
                await self.intake.accept(action.issue)  # what its outbox still holds
                await self.server.stop(action.issue)
                self.dirs.discard(action.issue)
                await while_beating(self.beat, "forget", self.host.forget, action.issue,
                                    keep_bookmark=action.keep_bookmark,
                                    keep_newest_push=action.keep_newest_push)
            case Hold():
                await self.tracker.add_labels(action.issue, [labels.user_input_needed])
                await self.tracker.comment(action.issue, action.comment or action.reason)
            case Complete():
                await self.tracker.set_state(action.issue, type=StateType.COMPLETED)
            case PassFeedback():
                for window in self._windows(action.issue, observed, alive=True):
                    await asyncio.to_thread(self.host.send_text, window.pane_id,
                                            FEEDBACK_MESSAGE.format(issue=action.issue))
                await self.tracker.remove_labels(
                    action.issue, [labels.user_feedback_given, labels.user_input_needed])
            case Resume():
                await self.tracker.remove_labels(
                    action.issue, [labels.user_feedback_given, labels.user_input_needed])
            case Tell():
                if wb.said(await self.tracker.get(action.issue), action.mark) is None:
                    await self.tracker.comment(action.issue, action.comment)
            case Continue():
                await self._continue(action, observed)
            case Waited() | Redo():
                pass  # only its record changes (the stall clock again; the work to redo)
            case Adopt():
                await self._adopt(action, issue, observed)
            case WriteBack():
                error = await self.writer.write_back(action.report)
                if error is not None:
                    raise error
            case PauseSwarm():
                pause = Pause(kind=action.pause_kind, cause=action.cause, fix=action.fix,
                              since=self.clock(), until=action.until,
                              quiet_workers=action.quiet_workers, probe=action.probe,
                              shared_from=action.shared_from)
                self.store.set_pause(pause)
                if action.share_account and self.accounts is not None:
                    self.accounts.share(pause)
            case EndPause():
                self.store.clear_pause(action.pause_kind, why=action.reason)
                if action.share_account and self.accounts is not None:
                    self.accounts.withdraw(action.pause_kind)
            case VerifyTrunk():
                await self.merges.verify_trunk(action)
            case OpenGroom():
                await self._open_groom(action)
            case ProbeAccount():
                if self.key_probe is not None:  # beside the loop: a request may take seconds
                    transcripts = [Path(r.transcript) for r in observed.records.values()
                                   if r.transcript and not r.done]
                    self._side(asyncio.to_thread(self.key_probe.run, transcripts,
                                                 self.clock()))
            case _:
                raise RalphError(f"unknown action {action!r}")
        return {}

    async def _lane(self, action: Action, outcome: MergeOutcome) -> None:
        """What a lane action came to, for its issue and the others of its batch: their
        records written, the comments posted, a failure of another issue's part recorded
        as that issue's failed merge; the action's own error ends it."""
        for name, part in outcome.others.items():
            await self._lane_part(name, part)
            if part.error is not None:
                self.failed(Merge(name, action.reason), part.error)
        if action.issue:
            await self._lane_part(action.issue, outcome)
        if outcome.error is not None:
            raise outcome.error

    async def _lane_part(self, name: str, part: MergeOutcome) -> None:
        if part.record:
            self.store.update_record(name, **part.record)
        for comment in part.comments:
            with contextlib.suppress(TrackerError):
                await self.tracker.comment(name, comment)

    def failed(self, action: Action, exc: Exception) -> bool:
        """Record one failed action where the failure policy says it ends; True when no
        other worker should start in this plan (every start would fail the same way)."""
        retryable = exc.retryable if isinstance(exc, RalphError) else True
        log.warning("action_failed", action=action.kind, issue=action.issue, error=str(exc))
        self.store.append_event(
            "action_failed", issue=action.issue or None, action=action.kind,
            reason=action.reason, error=str(exc), retryable=retryable)
        if isinstance(exc, LaneStale) or isinstance(action, WriteBack) \
                or not action.issue:
            return False  # already where it belongs (the write-back's own item, the lane)
        record = self.store.load_record(action.issue)
        judged = verdict(Failure(action, str(exc), retryable,
                                 tracker=isinstance(exc, TrackerError),
                                 setup=isinstance(exc, WorkspaceHookFailed),
                                 outside=isinstance(exc, HostUnavailable)),
                         record, self.settings, self.clock())
        if judged.record:
            self.store.update_record(action.issue, **judged.record)
        return judged.stop_starts

    # -- windows ----------------------------------------------------------------------------

    def _windows(self, name: str, observed: Observed, *, alive: bool | None = None
                 ) -> list[Window]:
        return [w for w in observed.windows
                if w.name == name and (alive is None or w.alive == alive)]

    async def _end_windows(self, action: Restart | Reap | Kill | Stop, observed: Observed
                           ) -> Ended | None:
        """Close the issue's windows where they run, its work kept first (on another
        host, its current attempt's final push: once its processes end nothing more can
        be pushed). What came back is the record's: ``final_push`` says the attempt's
        work did, and its agent's transcript is kept for the next attempt."""
        name = action.issue
        targets = [w.window_id for w in self._windows(name, observed)]
        if not targets:
            return None
        record = self.store.load_record(name)
        attempt = record.host_attempt if record is not None else 0
        ended = await while_beating(self.beat, "end", self.host.end, name, attempt, targets,
                                    bring_in=action.bring_in,
                                    session=record.session_id if record else None)
        if record is None:
            return ended
        changes: dict[str, object] = {}
        if ended.came_back:
            changes["final_push"] = attempt
        if ended.transcript is not None:
            changes["transcript"] = str(ended.transcript)
        if changes:
            self.store.update_record(name, **changes)
        return ended

    async def _bring_in(self, name: str, attempt: int) -> None:
        """The attempt's pushed work into the issue's workspace here, where the merge
        lane takes it (``decide`` asks only once its final push came back)."""
        await while_beating(self.beat, "fetch", self.host.bring_in, name, attempt)

    async def _continue(self, action: Continue, observed: Observed) -> None:
        targets = [w.pane_id for w in self._windows(action.issue, observed, alive=True)]
        if not action.typed or not targets:
            return
        for target in targets:
            self.host.dismiss(target)  # Claude Code's rate-limit menu
        await asyncio.sleep(DISMISS_SETTLE_S)
        for target in targets:
            self.host.send_text(target, CONTINUE)
        self.store.append_event("worker_continued", issue=action.issue, after=action.after)

    # -- starting a worker ----------------------------------------------------------------------

    async def _spawn(self, action: Spawn | Restart, issue: Issue | None,
                     ended: Ended | None = None) -> dict[str, object]:
        """Start the issue's worker as ``decide`` said (which session it resumes, whether
        the issue moves to its started state) on the worker host: its workspace made
        there, its launch built here and shipped there, its window opened there.
        ``ended``: what a restart's end of the worker brought back."""
        if issue is None:
            raise TrackerError(f"{action.issue}: not in the tracker's answer this tick")
        # a place on the host first: one refused changes nothing, and charges nothing
        with self.host.admit(action.issue, issue.priority):
            return await self._start(action, issue, ended)

    async def _start(self, action: Spawn | Restart, issue: Issue,
                     ended: Ended | None) -> dict[str, object]:
        if action.fresh_why:
            self.store.append_event("session_fresh", issue=action.issue, why=action.fresh_why)
        before = self.store.load_record(action.issue)
        stopped = before.lost.removeprefix(STOPPED) if before is not None and before.lost \
            and before.lost.startswith(STOPPED) else None
        # a new attempt's number before anything is placed by it: never two of one name
        attempt = (before.host_attempt if before else 0) + 1
        self.store.update_record(action.issue, host_attempt=attempt, final_push=0,
                                 lease_renewed_at=None)
        workspace: Path = await while_beating(
            self.beat, "spawn", self.host.make_workspace, action.issue, attempt,
            rebase=action.role is Role.RESOLVE)
        resume = action.resume
        if resume and ended is not None and not ended.session_kept:
            self.store.append_event(
                "session_fresh", issue=action.issue,
                why="the earlier session's transcript did not come back from its host "
                    "as its attempt ended")
            resume = None
        if resume and not self.host.sessions_found_in(workspace):
            self.store.append_event(
                "session_fresh", issue=action.issue,
                why=f"its workspace on its host ({workspace}) has a path too long for "
                    "Claude Code to find the session in")
            resume = None
        record = self.store.update_record(
            action.issue, **{**action.record_changes(self.clock()), "resumed": resume,
                             # until its window is open: a controller stopped (killed,
                             # frozen) mid-spawn is a cause outside the issue, and the next
                             # start charges nothing for it
                             "lost": SPAWN_UNFINISHED})
        if action.start_issue:
            await self.tracker.set_state(action.issue, type=StateType.STARTED)
        worker_dir = self.dirs.prepare(issue, action.role, workspace, action.attempt)
        await self.server.listen(self.dirs.names())
        launch = self.launcher(self.settings, issue, action.role, workspace,
                               action.model or role_model(self.settings, action.role),
                               attempt=action.attempt, feedback=human_feedback(issue),
                               resume_session=resume, worker_dir=worker_dir,
                               sent_back=record.sent_back if action.role.may_edit else None,
                               stopped=stopped)
        try:
            shipped = await while_beating(self.beat, "ship", self.host.ship, action.issue,
                                          attempt, launch, worker_dir, resume)
            # beating: a host lost mid-start takes a while to say so
            await while_beating(
                self.beat, "spawn", self.host.open_window, action.issue, attempt,
                cwd=launch.cwd, command=launch.argv,
                environment={**launch.env, ATTEMPT_VAR: str(attempt)},
                log_file=self.store.log_path(action.issue))
        except BaseException:
            launch.discard_secrets()
            raise
        if shipped:
            launch.discard_secrets()  # its host's copy is the launcher's to read and delete
        log.info("spawned", issue=action.issue, role=record.role.value, attempt=record.attempts)
        self._diffs_due.append(action.issue)  # its change so far, once the plan is done
        where = await asyncio.to_thread(self.host.placement, action.issue, attempt)
        if where is None:
            return {}
        self.store.update_record(action.issue, node=where.node, host=where.host)
        return {"node": where.node, "host": where.host, "host_attempt": attempt}

    def _side(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` beside the loop; it says nothing and fails quietly by itself."""
        self._hold(asyncio.create_task(work))

    def _hold(self, work: asyncio.Future[None]) -> None:
        """Keep ``work`` until it ends (the loop holds only weak references to tasks)."""
        self._beside.add(work)
        work.add_done_callback(self._beside.discard)

    async def _adopt(self, action: Adopt, issue: Issue | None, observed: Observed) -> None:
        record = self.store.load_record(action.issue)
        workspace = next((w for w in observed.workspaces if w.name == action.issue), None)
        if record is None or issue is None or workspace is None or not workspace.path:
            raise RalphError(f"{action.issue}: its record, issue or workspace is gone")
        self.dirs.prepare(issue, record.role, Path(workspace.path), record.attempts)
        await self.server.listen(self.dirs.names())
        self.store.append_event("worker_adopted", issue=action.issue,
                                why="started before the worker mailbox existed")

    async def _open_groom(self, action: OpenGroom) -> None:
        """Create the issue of a groom run ``decide`` found due; the next tick dispatches
        it. A tracker that fails is tried again next tick (decide still finds it due)."""
        labels = self.settings.labels
        try:
            created = await self.tracker.create_issues([NewIssue(
                title=GROOM_TITLE, labels=(labels.groom,),
                description=GROOM_DESCRIPTION.format(why=action.reason,
                                                     proposed=labels.proposed))])
        except RalphError as exc:
            self.store.append_event("groom_open_failed", why=action.reason, error=str(exc))
            raise
        self.store.append_event("groom_opened", issue=created[0], why=action.reason)


class WriteBackWriter:
    """The tracker writes workers' accepted reports owe, made exactly once: every write
    is found again before it is made (``core.writeback``), so a controller killed
    between two writes repeats nothing."""

    def __init__(self, settings: ProjectSettings, *, tracker: Tracker, store: StateStore,
                 writebacks: WriteBackQueue, clock: Callable[[], datetime]) -> None:
        self.settings = settings
        self.tracker = tracker
        self.store = store
        self.writebacks = writebacks
        self.clock = clock
        self._writing: set[str] = set()

    async def write_back(self, report: str) -> RalphError | None:
        """Make one accepted report's tracker writes; the error when they failed (kept on
        its item, classified: an outage is nobody's failure and is not counted)."""
        if report in self._writing:
            return None  # made right now by another caller (a worker's command, a tick)
        item = self.writebacks.get(report)
        if item is None:
            return None  # made already
        self._writing.add(report)
        try:
            details = await self._write(item)
        except TrackerError as exc:
            blame = blame_for(retryable=exc.retryable,  # unreachable: nobody's failure
                              outside=isinstance(exc, TrackerUnavailable))
            if blame is not Blame.OUTSIDE:
                item.failures += 1
                item.failed_at = self.clock()
            item.last_error, item.blame = str(exc)[:500], blame.value
            self.writebacks.add(item)
            # a write the tracker will never take is a person's to fix: its own event
            event = "relay_refused" if blame is Blame.PERMANENT else "relay_failed"
            self.store.append_event(event, issue=item.issue, report=item.kind,
                                    failures=item.failures, blame=blame.value, error=str(exc))
            return exc
        finally:
            self._writing.discard(report)
        self.writebacks.done(report)
        self.store.append_event("relayed", issue=item.issue, report=item.kind,
                                failures=item.failures, **details)
        return None

    async def _write(self, item: WriteBackItem) -> dict[str, Any]:
        match item.kind:
            case "done":
                return await self._write_done(item)
            case "blocked":
                await self._comment_once_and_label(item, wb.BLOCKED_MARK,
                                                   self.settings.labels.user_input_needed)
            case "note":
                await self._comment_once_and_label(item, wb.NOTE_MARK,
                                                   self.settings.labels.agent_feedback_given)
            case "plan":
                return await self._write_plan(item)
            case "propose":
                return await self._write_proposal(item)
            case "prioritize" | "flag":
                return await self._write_groom_change(item)
        return {}

    async def _write_done(self, item: WriteBackItem) -> dict[str, Any]:
        role = Role(item.body["role"])
        since = from_iso(item.body.get("since"))
        issue = await self.tracker.get(item.issue)
        if issue.state_type in (StateType.CANCELED, StateType.DUPLICATE):
            return {"skipped": f"the issue is {issue.state_name}"}
        active = issue.state_type in wb.ACTIVE
        if wb.said(issue, wb.DONE_MARK.format(issue=item.issue), since) is None:
            body = wb.evidence_comment(item.issue, role, str(item.body.get("summary", "")),
                                       item.body.get("verify"), self.settings.verify_command,
                                       from_iso(item.body.get("finished")) or utcnow(),
                                       item.body.get("spent"))
            if not active and not issue.state_type.finished:  # a person said "not now"
                body += "\n" + wb.kept_comment(item.issue, issue.state_name) + "\n"
            await self.tracker.comment(item.issue, body, by_ralph=True)
        name, type_ = wb.done_target(self.settings, role)
        if active and (name is not None or type_ is not None) \
                and not wb.in_state(issue, name, type_):
            issue = await self.tracker.set_state(item.issue, name=name, type=type_)
        return {"state": issue.state_name}

    async def _comment_once_and_label(self, item: WriteBackItem, mark: str, label: str) -> None:
        body = wb.report_comment(mark, item.issue, str(item.body["text"]))
        since = from_iso(item.body.get("since"))
        issue = await self.tracker.get(item.issue)
        if not any(c.by_ralph and c.body == body
                   and (since is None or c.created_at is None or c.created_at >= since)
                   for c in issue.comments):
            await self.tracker.comment(item.issue, body, by_ralph=True)
        if label not in issue.labels:
            await self.tracker.add_labels(item.issue, [label])

    async def _write_plan(self, item: WriteBackItem) -> dict[str, Any]:
        issue = await self.tracker.get(item.issue)
        if issue.children:  # made before a restart: never twice
            created = list(issue.children)
        else:
            entries = [NewIssue(**{**e, "labels": tuple(e.get("labels", ())),
                                   "blocked_by": tuple(e.get("blocked_by", ()))})
                       for e in item.body["entries"]]
            created = list(await self.tracker.create_issues(entries))
            self.store.append_event("worker_plan", issue=item.issue, created=created)
        # learning keeps one record per phase, so the repeat after a restart adds nothing
        remember_safely(self.settings, self.store, item.issue,
                          plan_text(str(item.body.get("text", "")), item.body["entries"]),
                          created, utcnow())
        return {"created": created}

    async def _comment_once(self, target: str, body: str, mark: str) -> None:
        issue = await self.tracker.get(target)
        if wb.said(issue, mark) is None:
            await self.tracker.comment(target, body, by_ralph=True)

    async def _write_proposal(self, item: WriteBackItem) -> dict[str, Any]:
        body, mark = item.body, wb.groom_mark(item.issue, item.id)
        reason, ready = str(body["reason"]), bool(body.get("ready"))
        found = [i for i in await self.tracker.list_issues() if mark in i.description]
        if found:
            created = found[0].identifier
        else:
            description = str(body.get("description", "")).strip()
            created = (await self.tracker.create_issues([NewIssue(
                title=str(body["title"]), priority=int(body.get("priority", 0)),
                description=f"{description}\n\nProposed by {mark}: {reason}".strip(),
                labels=(self.settings.labels.proposed,),
                state_type=None if ready else StateType.BACKLOG)]))[0]
            self.store.append_event("groom_proposed", issue=item.issue, created=[created],
                                    ready=ready)
        await self._comment_once(created, wb.proposal_comment(mark, reason, ready), mark)
        return {"created": created}

    async def _write_groom_change(self, item: WriteBackItem) -> dict[str, Any]:
        body, mark = item.body, wb.groom_mark(item.issue, item.id)
        reason, target = str(body["reason"]), str(body["target"])
        if item.kind == "prioritize":
            new, was = int(body["priority"]), int(body.get("was", 0))
            await self.tracker.set_priority(target, new)
            await self._comment_once(target, wb.priority_comment(mark, was, new, reason), mark)
            return {"target": target, "priority": new}
        what, comment = wb.flag_comment(mark, body.get("duplicate_of"), reason)
        await self._comment_once(target, comment, mark)
        issue = await self.tracker.get(target)
        if self.settings.labels.agent_feedback_given not in issue.labels:
            await self.tracker.add_labels(target, [self.settings.labels.agent_feedback_given])
        return {"target": target, "flag": what}

