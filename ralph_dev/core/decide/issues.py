"""The rules for each issue and its worker: dispatch, dependencies, limits, orphans,
zombies, stuck workers, merges, retries and holds, and whether a groom run is due."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ralph_dev.core.actions import (
    ANSWERED,
    STOPPED,
    SWARM,
    Action,
    Complete,
    Forget,
    Hold,
    Kill,
    Merge,
    Nudge,
    PassFeedback,
    ProbeAccount,
    Reap,
    Redo,
    Restart,
    Resume,
    Spawn,
    Stop,
    Tell,
    Wait,
)
from ralph_dev.core.cluster import lease_ends
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.decide.swarm import AGENT_PAUSES, agent_fault
from ralph_dev.core.decide.world import (
    World,
    aware,
    dispatch_key,
    model_for,
    nudge_message,
    ready_in,
    said_since_start,
    seconds,
)
from ralph_dev.core.groom import PRIORITY_NAMES
from ralph_dev.core.host_share import (
    NO_PRIORITY,
    ProjectLoad,
    host_allowance,
    host_said,
    urgency,
)
from ralph_dev.core.model import (
    MODEL_CALL_STATES,
    Issue,
    Pause,
    Role,
    StateType,
    Window,
    WorkerRecord,
    Workspace,
)
from ralph_dev.core.pacing import KEY_PROBE_EVERY, pace
from ralph_dev.core.policy import RetryPolicy, hold_comment, retry_policy
from ralph_dev.core.writeback import ACTIVE, completes_on_merge, said

# --- decide ----------------------------------------------------------------------


HANG_RESTARTS = 2
"""Free restarts for hung model calls in a row (no answer between them) before the
silence is treated as the worker's own."""

HOST_LOST = "the cluster lost the host its worker ran on"
SERVER_LOST = "its tmux server on its host went away"
"""Why a cluster worker ended for no fault of the issue's: its next start is free."""

RESUME_FAILED = "its agent could not resume its earlier session"
"""Why a worker started to resume a session ended before its agent said anything (the
CLI found no such conversation): ralph-dev's choice failed, not the issue; its next
start, a fresh session, is free."""
API_STOPPED = "its agent's turn ended on the model API's error"
"""Why a worker whose CLI exits with its turn (Codex's ``exec``) ended on a usage limit
or an outage: a cause outside the issue, so its next start, in its own session once the
pause is over, is free."""

PERSONS_DONE = "a person completed the issue"
"""Why a worker is stopped when a person completes its issue under it."""


@dataclass
class Candidate:
    """A spawn waiting for a free slot (limits are applied after every issue is seen)."""

    issue: Issue
    role: Role
    attempt: int
    reason: str


@dataclass
class Decider:
    world: World
    now: datetime
    pauses: tuple[Pause, ...] = ()
    """The pauses in force once this plan's pause rules are carried out."""
    waited: frozenset[str] = frozenset()
    """Workers whose stall clocks start again in this plan (a pause they waited out is
    over): their silence so far was the pause's, not theirs."""
    actions: list[Action] = field(default_factory=list)
    waits: dict[str, Wait] = field(default_factory=dict)
    """Why each issue is left alone this tick (the first reason found)."""
    resolves: list[Candidate] = field(default_factory=list)
    orphans: list[Candidate] = field(default_factory=list)
    merged: bool = False
    ready: list[str] = field(default_factory=list)
    """Changes ready to merge through the verified lane (``core.decide.lane``)."""
    idle: bool = False
    """Workers could start and no issue waits for one (``groom.when_idle``)."""
    load: ProjectLoad | None = None
    """The project's load on the host (``host_share``), for the plan."""
    slots_wanted: int | None = None
    """Worker slots to ask the cluster's autoscaler for (``slots_to_ask``), for the plan."""

    @property
    def settings(self) -> ProjectSettings:
        return self.world.settings

    @property
    def tracker_ok(self) -> bool:
        return self.world.observed.tracker_ok

    @property
    def trunk_red(self) -> bool:
        return self.world.observed.trunk_red

    @property
    def paused(self) -> bool:
        """A cause outside any issue stops every start; no attempt is charged meanwhile."""
        return bool(self.pauses)

    @property
    def workers_waiting(self) -> bool:
        return any(p.quiet_workers for p in self.pauses)

    @property
    def policy(self) -> RetryPolicy:
        return retry_policy(self.settings)

    def emit(self, *actions: Action) -> None:
        self.actions.extend(actions)

    def wait(self, ident: str, kind: str, why: str, **figures: Any) -> None:
        self.waits.setdefault(ident, Wait(kind, why, **figures))

    def wait_paused(self, ident: str) -> None:
        pause = self.pauses[0]
        self.wait(ident, "pause", f"the swarm is paused ({pause.kind}): {pause.cause}",
                  until=pause.until)

    @property
    def trunk_checking(self) -> bool:
        """Trunk's own verify is owed or under way (``merge.verify_trunk``, or a red trunk
        that moved): merges wait for it."""
        obs = self.world.observed
        return bool(obs.trunk_due) or (obs.lane is not None and obs.lane.kind == "trunk")

    def take_merge_slot(self) -> bool:
        """Merges outside the verified lane run one at a time, in identifier order. When
        trunk is verified after each (``merge.verify_trunk``) only one goes per plan: its
        verify comes next (the verified lane batches instead: ``core.decide.lane``)."""
        if self.merged and self.settings.merge.verify_trunk:
            return False
        self.merged = True
        return True

    def merge_backing_off(self, ident: str) -> bool:
        """A failed merge waits the retry policy's delay before the next try, so one failing
        issue neither loops every tick nor keeps the merge slot from the issues behind it."""
        rec = self.world.records.get(ident)
        if rec is None:
            return False
        return not self.policy.due(rec.merge_failures, rec.merge_failed_at, self.now)

    def attempts(self, ident: str) -> int:
        rec = self.world.records.get(ident)
        return rec.attempts if rec is not None else 0

    # -- the per-issue tree ---------------------------------------------------------

    def issue_chain(self, ident: str) -> None:
        w = self.world
        issue = w.issues.get(ident)
        rec = w.records.get(ident)
        if self.asked_for_person(ident, issue, rec):
            return
        if issue is not None and issue.foreign:
            self.unknown(ident)  # another project's issue: never ours to act on
        elif issue is not None and issue.state_type in (StateType.CANCELED, StateType.DUPLICATE):
            self.canceled(ident, issue)
        elif rec is not None and rec.done:
            self.done(ident, issue)
        elif issue is not None and issue.state_type == StateType.COMPLETED:
            if w.live(ident) and not self.resolving(ident):
                self.zombie(ident)
            elif w.live(ident):
                self.live_worker(ident, issue)
            else:
                self.finished(ident, issue)
        elif issue is not None:
            self.unfinished(ident, issue)
        else:
            self.unknown(ident)

    def asked_for_person(self, ident: str, issue: Issue | None, rec: WorkerRecord | None
                         ) -> bool:
        """A failure asked for a person (a merge jj will never make, a hold whose write
        failed): hold the issue with that comment, its worker stopped first."""
        if rec is None or rec.hold_reason is None or issue is None or not self.tracker_ok \
                or issue.state_type in (StateType.CANCELED, StateType.DUPLICATE):
            return False
        if self.world.feedback(ident) or self.world.held(ident):
            return False  # held already, or a person answered: the usual rules apply
        if self.world.live(ident):
            self.emit(Kill(ident, f"{ident}: stopping its worker before it is held"))
        self.emit(Hold(ident, f"{ident}: holding it for a person", comment=rec.hold_reason))
        return True

    def resolving(self, ident: str) -> bool:
        """A worker reworking a finished issue's change is not a zombie: a resolve worker
        on its conflicted workspace, or a worker fixing a change sent back by verify."""
        rec = self.world.records.get(ident)
        ws = self.world.workspaces.get(ident)
        if rec is None or ws is None:
            return False
        return (rec.role == Role.RESOLVE and ws.conflicted) or self.world.sent_back(ident)

    def canceled(self, ident: str, issue: Issue) -> None:
        state = issue.state_type.value
        if ident in self.world.windows:
            how = "still running" if self.world.live(ident) else "left over"
            self.emit(Kill(ident, f"{ident} is {state}: closing its window ({how})"))
        if ident in self.world.workspaces:
            self.emit(
                Forget(
                    ident,
                    f"{ident} is {state}: forgetting its workspace, its change stays "
                    "reachable under a bookmark",
                    keep_bookmark=True,
                )
            )

    def done(self, ident: str, issue: Issue | None) -> None:
        w = self.world
        ws = w.workspaces.get(ident)
        has_window = ident in w.windows
        if ws is None:
            if has_window:
                self.emit(Kill(ident, f"{ident}: worker reported done and its work is merged; "
                                      "closing its window"))
            elif issue is not None and not issue.state_type.finished:
                self.parent_or_review(ident, issue)
            return
        if ws.conflicted:
            if has_window:
                self.emit(Kill(ident, f"{ident}: worker reported done but its change conflicts "
                                      "with trunk; closing its window so a resolve worker can "
                                      "start"))
            else:
                self.resolve(ident, issue)
            return
        if issue is not None and not issue.state_type.finished \
                and issue.state_type not in ACTIVE:
            if has_window:
                self.emit(Kill(ident, f"{ident}: worker reported done; closing its window"))
            self.wait(ident, "stopped", f"done, but in {issue.state_name!r}: its change waits, "
                                        "unmerged, until a person moves it back")
            mark = f"[ralph-dev] {ident} done while in {issue.state_name}"
            if said(issue, mark) is None:
                self.emit(Tell(ident, f"{ident}: worker reported done while the issue is in "
                                      f"{issue.state_name!r}: telling the person", mark=mark,
                               comment=f"{mark}: its worker finished, and its change waits, "
                                       "unmerged, under the bookmark "
                                       f"ralph/{ident}. Move the issue back to a started "
                                       "state and ralph-dev merges it; cancel it and the "
                                       "change stays under the bookmark."))
            return  # a person moved it out of the active states: its change waits, unmerged
        if self.trunk_red:
            self.wait(ident, "merge", "done; trunk is red: merges wait until it is green")
            return  # trunk is red: nothing moves for done work until it is green again
        self.merge_chain(ident, ws, f"{ident}: worker reported done", has_window)

    def merge_chain(self, ident: str, ws: Workspace, why: str, has_window: bool) -> None:
        """Kill, then merge, then forget: never forget unmerged work.

        The window goes first so no agent writes into the workspace while jj
        snapshots and rebases it, and so a conflicted merge leaves no finished
        worker's window behind to be mistaken for the resolve worker. The merge
        is proposed even when the observed workspace looks empty: observation
        does not snapshot, so an agent's last edits may not be recorded yet; the
        merge snapshots first and reports "nothing to merge" when that is true.
        """
        if has_window:
            self.emit(Kill(ident, f"{why}: closing its window"))
        rec = self.world.records.get(ident)
        if rec is not None and rec.node and rec.role.may_edit:
            if has_window:  # the fence: only work its final push brought back is merged
                self.wait(ident, "merge", "done; its work comes back from its host as its "
                                          "window closes, and is merged next")
                return
            if rec.final_push != rec.host_attempt and not rec.merged_at:
                self.emit(Redo(ident, f"{ident}: attempt {rec.host_attempt} on "
                                      f"{rec.host or 'its host'} reported done, but its host "
                                      "was lost before its final push came back; its last "
                                      f"snapshot (bookmark ralph/{ident}/a{rec.host_attempt}, "
                                      "if it pushed one) may hold only part of its work, so a "
                                      "new attempt starts from it, no attempt charged"))
                return
        if rec is not None and not rec.role.may_edit:
            # review, research, plan and groom workers change no code: whatever their
            # workspace holds (Bash can write files) never reaches trunk; it stays
            # reachable under its bookmark for a person to look at
            if not self.complete_after(ident, rec, why):
                return
            self.emit(Forget(ident, f"{why}: a {rec.role.value} worker's workspace is not "
                                    "merged (only execute and resolve workers change code); "
                                    f"anything in it stays under the bookmark ralph/{ident}",
                             keep_bookmark=True))
            return
        if self.world.feedback(ident):
            self.resume(ident)  # a person answered the hold: the merge is tried again
            return
        if self.world.held(ident):
            return  # a person must answer first (a refused merge is held for one)
        if rec is not None and rec.merged_at is not None and not ws.has_unmerged_change \
                and not ws.conflicted:  # merged already: what is left is the bookkeeping
            if self.complete_after(ident, rec, why):
                self.emit(Forget(ident, f"{why}: forgetting its workspace (merged)"))
            return
        if self.merge_backing_off(ident):
            assert rec is not None and rec.merge_failed_at is not None
            self.wait(ident, "merge", f"its merge failed {rec.merge_failures} time(s): tried "
                                      "again after the backoff", attempt=rec.merge_failures,
                      of=self.settings.timing.max_attempts, last_error=rec.last_failure,
                      until=aware(rec.merge_failed_at)
                      + timedelta(seconds=self.policy.delay(rec.merge_failures)))
            return  # its last merge failed: retried after a backoff, not holding the slot
        if self.trunk_checking:
            self.wait(ident, "merge", "done; trunk is being verified after the last merge: "
                                      "merges wait for it")
            return
        if self.settings.verifies_merges:
            if has_window:
                self.wait(ident, "merge", "done; its window closes, then its change joins "
                                          "the merge lane")
            else:
                self.ready.append(ident)  # the lane's rules take it (``core.decide.lane``)
            return
        if not self.take_merge_slot():
            self.wait(ident, "merge", "done; merges go one at a time: it is next")
            return  # trunk is verified after each merge: this one goes next tick
        change = "its change" if ws.has_unmerged_change else "whatever it holds"
        self.emit(Merge(ident, f"{why}: merging {change} into trunk"))
        if rec is not None and not self.complete_after(ident, rec, why):
            return
        self.emit(Forget(ident, f"{why}: forgetting its workspace (after the merge)"))

    def complete_after(self, ident: str, rec: WorkerRecord, why: str) -> bool:
        """A done worker's issue is completed once its change is in trunk (the action
        after the merge, before its record goes with the workspace), never before. False
        when it is to be completed and the tracker cannot take it now: the record stays
        (and the workspace with it), so a later tick completes it."""
        issue = self.world.issues.get(ident)
        if not (rec.done and completes_on_merge(self.settings, rec.role)):
            return True
        if issue is None or not self.tracker_ok:
            return False  # its state cannot be read or written now: a later tick does it
        # started: where a worker's issue waits for its merge; one a person moved back to
        # a ready state after its done is wanted again, and stays there
        if issue.state_type is not StateType.STARTED:
            return True
        self.emit(Complete(ident, f"{why}: its work is in trunk; completing the issue"))
        return True

    def zombie(self, ident: str) -> None:
        """A person completed the issue while its worker ran: their word wins. The worker
        is stopped and its unfinished change kept, unmerged (``keep_unmerged``)."""
        self.emit(Stop(ident, f"{ident} was completed by a person while its worker was "
                              "running: stopping its worker", cause="state",
                       why=PERSONS_DONE))
        self.keep_unmerged(ident)

    def keep_unmerged(self, ident: str) -> None:
        """Put the workspace of an issue a person completed while it was worked on away,
        its change kept under its bookmark, with a comment naming how to merge it."""
        if ident not in self.world.workspaces:
            return
        why = f"{ident} was completed by a person while its worker was running"
        mark = f"[ralph-dev] {ident} completed while its worker ran"
        trunk = self.settings.trunk
        self.emit(Tell(ident, f"{why}: telling them where its unfinished change is", mark=mark,
                       comment=f"{mark}: its worker was stopped and its change was not merged; "
                               f"it is kept under the bookmark ralph/{ident}. To merge it as "
                               f"it is: `jj rebase -b ralph/{ident} -d {trunk} && jj bookmark "
                               f"set {trunk} -r ralph/{ident}`; or move the issue back to a "
                               "started state and ralph-dev goes on with it."))
        self.emit(Forget(ident, f"{why}: putting its workspace away; its change stays under "
                                f"the bookmark ralph/{ident}", keep_bookmark=True))

    def finished(self, ident: str, issue: Issue) -> None:
        """Completed, no done marker, no live window: merge/forget what is left."""
        w = self.world
        ws = w.workspaces.get(ident)
        has_window = ident in w.windows
        why = f"{ident} is completed"
        rec = w.records.get(ident)
        if rec is not None and rec.lost == f"{STOPPED}{PERSONS_DONE}":
            if has_window:
                self.emit(Kill(ident, f"{why}: closing its dead window"))
            self.keep_unmerged(ident)  # its worker was stopped by that Done: not its work
            return
        if ws is None:
            if has_window:
                self.emit(Kill(ident, f"{why}: closing its dead window"))
            return
        if ws.conflicted:
            if has_window:
                self.emit(Kill(ident, f"{why}: closing its dead window before resolving"))
            else:
                self.resolve(ident, issue)
            return
        if w.sent_back(ident):
            if has_window:
                self.emit(Kill(ident, f"{why}: closing its dead window before it is redone"))
            else:
                self.rework(ident, issue, Role.EXECUTE,
                            "its change fails the verify command on top of trunk")
            return
        if self.trunk_red:
            if has_window:
                self.emit(Kill(ident, f"{why}: closing its dead window; merge waits (trunk red)"))
            return
        self.merge_chain(ident, ws, why, has_window)

    def resolve(self, ident: str, issue: Issue | None) -> None:
        self.rework(ident, issue, Role.RESOLVE, "its change conflicts with trunk")

    def rework(self, ident: str, issue: Issue | None, role: Role, what: str) -> None:
        """Queue a worker for a finished issue's change that cannot merge as it is
        (conflicted, or red on top of trunk); cap, backoff and holds apply."""
        if issue is None or not self.tracker_ok:
            return
        if self.world.feedback(ident):
            self.resume(ident)
            return
        if self.world.held(ident):
            return
        self.retry(ident, issue, role, what, self.resolves)

    def retry(
        self, ident: str, issue: Issue, role: Role, what: str, queue: list[Candidate]
    ) -> None:
        """Cap → Hold; backoff not elapsed → wait; else queue a spawn of attempt n+1.

        A worker lost for a cause outside the issue (its tmux session went away) is
        started again at once, as the same attempt: nothing is charged for it.
        """
        if self.paused:
            self.wait_paused(ident)
            return  # nothing starts, nothing is held at the cap, while the swarm is paused
        rec = self.world.records.get(ident)
        attempts = self.attempts(ident)
        cap = self.settings.timing.max_attempts
        if rec is not None and rec.lost == ANSWERED:
            queue.append(Candidate(issue, role, max(attempts, 1),
                                   f"{ident}: {ANSWERED}; its worker starts again at once, in "
                                   f"its session, attempt {max(attempts, 1)}/{cap}"))
            return
        if rec is not None and rec.lost:
            queue.append(Candidate(issue, role, max(attempts, 1),
                                    f"{ident}: {what}; its worker was lost ({rec.lost[:120]}), "
                                    f"no attempt charged ({max(attempts, 1)}/{cap})"))
            return
        if self.policy.exhausted(attempts):
            self.hold(ident, what)
            return
        failed_at = rec.last_failure_at if rec is not None else None
        wait = self.policy.delay(attempts)
        if not self.policy.due(attempts, failed_at, self.now):
            assert failed_at is not None
            last_error = rec.last_failure if rec is not None else None
            self.wait(ident, "retry", f"{what}: attempt {attempts + 1}/{cap} after a "
                                      f"{wait:g}s backoff", attempt=attempts + 1, of=cap,
                      until=aware(failed_at) + timedelta(seconds=wait),
                      last_error=last_error[:300] if last_error else None)
            return  # backing off; the next tick looks again
        backoff = f" after {wait:g}s backoff" if failed_at is not None and wait > 0 else ""
        last = f" (last failure: {rec.last_failure[:120]})" if rec and rec.last_failure else ""
        queue.append(
            Candidate(
                issue,
                role,
                attempts + 1,
                f"{ident}: {what}{last}, attempt {attempts + 1}/{cap}{backoff}",
            )
        )

    def hold(self, ident: str, what: str) -> None:
        """Stop retrying and tell the person, on the issue, what happened and how to go on."""
        rec = self.world.records.get(ident)
        attempts = self.attempts(ident)
        cap = self.settings.timing.max_attempts
        last = (rec.last_failure or "unknown") if rec else "unknown"
        when = (
            f" at {aware(rec.last_failure_at).isoformat(timespec='seconds')}"
            if rec is not None and rec.last_failure_at
            else ""
        )
        cause = (f"{what}; it stopped retrying after {attempts}/{cap} attempts. "
                 f"Last failure: {last[:300]}{when}")
        self.emit(Hold(ident, f"{ident}: {what}; attempt cap {cap} reached, holding it",
                       comment=hold_comment(ident, cause,
                                            self.settings.labels.user_feedback_given)))

    def resume(self, ident: str) -> None:
        if self.tracker_ok:
            self.emit(Resume(ident, f"{ident}: a person gave feedback "
                                    f"({self.settings.labels.user_feedback_given}); lifting the "
                                    "hold and resetting attempts"))

    def parent_or_review(self, ident: str, issue: Issue) -> None:
        """No window, no workspace: complete a finished container (review is dispatch's)."""
        kids = self.world.kids(ident)
        if kids and self.tracker_ok and all(self.world.finished(k) for k in kids):
            self.emit(Complete(ident, f"{ident}: all {len(kids)} sub-issues are finished"))

    def unfinished(self, ident: str, issue: Issue) -> None:
        w = self.world
        windows = w.windows.get(ident, [])
        live = w.live(ident)
        if w.feedback(ident):
            if live:
                if self.tracker_ok:
                    self.emit(PassFeedback(
                        ident, f"{ident}: a person gave feedback; handing it to the running "
                               "worker", lifts_hold=w.has(ident, self.settings.labels
                                                          .user_input_needed)))
                return
            if windows:  # the worker that asked ended its session meanwhile
                status = next((win.exit_status for win in windows
                               if win.exit_status is not None), None)
                self.emit(Reap(ident, f"{ident}: a person answered; closing its ended pane "
                                      f"(exit {status if status is not None else 'unknown'}), "
                                      "a worker starts again at once in its session",
                               exit_status=status, charged=False))
            self.resume(ident)
            return
        if w.held(ident):
            rec = w.records.get(ident)
            if live and not (rec is not None and rec.blocked):  # not a worker's own question
                label = next(name for name in (self.settings.labels.hold,
                                               self.settings.labels.user_input_needed)
                             if w.has(ident, name))
                self.emit(Stop(ident, f"{ident} is held ({label}): stopping its worker; its "
                                      "workspace and session are kept", cause="hold",
                               why=f"a person put the issue on hold (the label {label})"))
            self.wait(ident, "held", "held for a person")
            return  # held: a person has to answer first; never nudge or respawn
        if windows and not live:
            self.reap(ident, windows)
            return
        if live and issue.state_type not in ACTIVE:  # a person's "not now"
            self.emit(Stop(ident, f"{ident} was moved to {issue.state_name!r}: stopping its "
                                  "worker; its workspace and session are kept", cause="state",
                           why=f"a person moved the issue to {issue.state_name!r}"))
            return
        if live:
            self.live_worker(ident, issue)
            return
        if w.kids(ident):
            self.parent_or_review(ident, issue)
            return
        if issue.state_type not in ACTIVE:
            self.wait(ident, "stopped", f"in {issue.state_name!r}: not worked on until a "
                                        "person moves it to a ready or started state")
            return
        if issue.state_type != StateType.STARTED or w.review_dispatch(issue):
            return  # unstarted and review dispatches are collected by ready_in
        if not self.tracker_ok or ident in w.observed.relaying:
            self.wait(ident, "tracker", "its worker's report still owes the tracker a write"
                      if self.tracker_ok else "the tracker cannot be read")
            return  # its worker's report still owes the tracker a write: the state is stale
        blocker = w.blocker_of(issue)
        if blocker is not None:
            self.wait(ident, "blocked", f"started, but waits for {blocker} again")
            return  # started but blocked again: wait for the blocker like dispatch does
        rec = w.records.get(ident)
        if rec is not None and rec.running and rec.node and not rec.lost \
                and rec.final_push != rec.host_attempt:
            # a cluster worker's actor outlives its agent, until the controller ends it
            # (after its final push); one gone otherwise died with its host (Ray released
            # the name of a lost node's actor)
            self.emit(Reap(ident, f"{ident}: {HOST_LOST}; a new attempt starts on another "
                                  "host from its last pushed snapshot, no attempt charged",
                           charged=False, lost=HOST_LOST))
            return
        self.retry(ident, issue, w.route(issue), "no worker is running for it", self.orphans)

    def reap(self, ident: str, windows: list[Window]) -> None:
        if any(win.host_lost for win in windows):
            self.emit(Reap(ident, f"{ident}: {HOST_LOST}; closing it, a new attempt starts on "
                                  "another host from its last pushed snapshot, no attempt "
                                  "charged", charged=False, lost=HOST_LOST))
            return
        if any(win.server_lost for win in windows):
            self.emit(Reap(ident, f"{ident}: {SERVER_LOST} (its pane never exited); closing "
                                  "it, a worker starts again at once, no attempt charged",
                           charged=False, lost=SERVER_LOST))
            return
        statuses = [win.exit_status for win in windows if win.exit_status is not None]
        status = statuses[0] if statuses else None
        shown = f"exit {status}" if status is not None else "exit status unknown"
        rec = self.world.records.get(ident)
        fault = agent_fault(rec, self.settings) if rec is not None else None
        if fault is not None and fault.kind in AGENT_PAUSES and rec is not None \
                and rec.agent_error_at is not None and (
                    rec.started_at is None or aware(rec.agent_error_at) >= aware(rec.started_at)):
            self.emit(Reap(ident, f"{ident}: {API_STOPPED} ({shown}: {fault.cause[:160]}); "
                                  "closing its pane, it goes on in its own session once the "
                                  "pause is over, no attempt charged",
                           exit_status=status, charged=False, lost=API_STOPPED))
            return
        words = next((win.last_words for win in windows if win.last_words), "")
        said = f"; its last output: «{words}»" if words else ""
        if rec is not None and rec.resumed and not said_since_start(rec):
            self.emit(Reap(ident, f"{ident}: pane died ({shown}) before its agent said "
                                  f"anything, started to resume session {rec.resumed}"
                                  f"{said}; closing it, the next start is a fresh session, "
                                  "no attempt charged",
                           exit_status=status, charged=False, lost=RESUME_FAILED,
                           forget_session=True))
            return
        refused = (f"; its last `worker done` was refused: {rec.last_refusal[:300]}"
                   if rec is not None and rec.last_refusal else "")
        self.emit(Reap(ident, f"{ident}: pane died ({shown}) without a done marker{refused}"
                              f"{said}; closing it, a retry follows after backoff",
                       exit_status=status))

    def live_worker(self, ident: str, issue: Issue) -> None:
        """Stuck detection: nudge once after stall_timeout, restart after restart_timeout.
        The clock starts at the worker's last sign of life or at the end of the last pause
        it waited out, whichever is later."""
        if self.workers_waiting or ident in self.waited:
            return  # waiting out a usage limit or an outage with everyone else: not stuck
        w = self.world
        timing = self.settings.timing
        rec = w.records.get(ident)
        if rec is not None and rec.gave_up is not None:
            self.gave_up(ident, issue, rec)
            return
        seen = [
            win.output_changed_at or win.last_activity
            for win in w.windows.get(ident, [])
            if win.alive
        ]
        stamps = [aware(t) for t in seen if t is not None]
        changed = max(stamps) if stamps else (rec.started_at if rec else None)
        if changed is None:
            return
        if rec is not None and rec.waited_until is not None:
            changed = max(changed, aware(rec.waited_until))
        idle = seconds(self.now, changed)
        if rec is not None and self.hung(ident, issue, rec, idle):
            return
        if idle <= timing.stall_timeout:
            return
        nudged = rec.nudged_at if rec is not None else None
        # Typing the nudge changes the pane, and the observer notices it a tick
        # later: output that changed only that soon after a nudge is its echo.
        echo = 2 * timing.poll_interval + 5
        if nudged is None or seconds(changed, nudged) > echo:
            self.emit(Nudge(ident, f"{ident}: no activity for {idle:.0f}s "
                                   f"(stall timeout {timing.stall_timeout:g}s); nudging",
                            message=nudge_message(ident)))
            return
        since = seconds(self.now, nudged)
        if since <= timing.restart_timeout or not self.tracker_ok or self.paused:
            return
        attempts = self.attempts(ident)
        cap = timing.max_attempts
        what = f"still silent {since:.0f}s after a nudge"
        if attempts >= cap:
            self.emit(Kill(ident, f"{ident}: {what}; attempt cap {cap} reached, stopping it"))
            self.hold(ident, what)
            return
        role = rec.role if rec is not None else w.route(issue)
        self.emit(Restart(ident, f"{ident}: {what}; restarting, attempt {attempts + 1}/{cap}",
                          role=role, attempt=attempts + 1,
                          model=model_for(issue, role, self.settings)))

    def gave_up(self, ident: str, issue: Issue, rec: WorkerRecord) -> None:
        """An agent that ended turn after turn without ``worker done`` and without asking
        will not finish by being pushed on: it is restarted once in its own session (the
        issue's own failure, charged), and then held with its last message quoted, not
        walked to the attempt cap."""
        if not self.tracker_ok or self.paused:
            return
        cap = self.settings.timing.max_attempts
        attempts = self.attempts(ident)
        what = (f"its agent ended {self.settings.agent.iteration_cap} turns in a row without "
                "`ralph-dev worker done` and without asking anything")
        if attempts < 2 and attempts < cap:
            self.emit(Restart(ident, f"{ident}: {what}; restarting it once in its own session, "
                                     f"attempt {attempts + 1}/{cap}",
                              role=rec.role, attempt=attempts + 1,
                              model=model_for(issue, rec.role, self.settings)))
            return
        quoted = "\n".join(f"> {line}" for line in (rec.gave_up or "(no text)").splitlines())
        self.emit(Kill(ident, f"{ident}: {what}, after a restart; stopping it"),
                  Hold(ident, f"{ident}: {what}, after a restart; holding it",
                       comment=hold_comment(ident, f"{what}, on attempt {attempts}/{cap}. "
                                                   f"Its last message:\n\n{quoted}\n",
                                            self.settings.labels.user_feedback_given)))

    def hung(self, ident: str, issue: Issue, rec: WorkerRecord, idle: float) -> bool:
        """An agent that waits for the model and has shown no sign of life (no hook, no
        transcript growth) for ``hang_timeout`` is on a hung model call: nudging its frozen
        pane does nothing, so it is restarted in its own session, free. The model answering
        it again (a tool call) resets the count; past ``HANG_RESTARTS`` in a row the
        silence is left to the stall rule, so a long answer is never restarted forever. A
        CLI whose pane says it retries by itself (an overload, a short rate limit) is not
        hung: it ends that by itself, answered or on a StopFailure that pauses the swarm."""
        timeout = self.settings.timing.hang_timeout
        if rec.agent_state not in MODEL_CALL_STATES or idle <= timeout \
                or rec.hang_restarts >= HANG_RESTARTS:
            return False
        retry = self.world.observed.retrying.get(ident)
        if retry is not None:  # the CLI rides out a refusal by itself: no hang, no stall
            self.wait(ident, "model", f"its agent's CLI retries the model API by itself "
                                      f"({retry}); silent {idle:.0f}s")
            return True
        if self.tracker_ok and not self.paused:
            attempts = max(self.attempts(ident), 1)
            self.emit(Restart(
                ident, f"{ident}: the model API has not answered for {idle:.0f}s (hang timeout "
                       f"{timeout:g}s); restarting it in its own session, no attempt charged "
                       f"({attempts}/{self.settings.timing.max_attempts})",
                role=rec.role, attempt=attempts, model=model_for(issue, rec.role, self.settings),
                charged=False, hangs=rec.hang_restarts + 1))
        return True

    def unknown(self, ident: str) -> None:
        """An identifier with no issue (tracker down, or not in this project): tidy only."""
        windows = self.world.windows.get(ident, [])
        if windows and not self.world.live(ident):
            self.reap(ident, windows)

    # -- spawns under limits ------------------------------------------------------

    def spawns(self) -> None:
        if self.settings.cluster is not None:
            self.slots_wanted = 0  # unless issues wait for a slot below
        if self.tracker_ok:
            self.blocked_waits()
        if not self.tracker_ok or self.paused:
            for issue in ready_in(self.world) if self.tracker_ok else ():
                self.wait_paused(issue.identifier)
            return
        obs = self.world.observed
        hold = pace(obs.account_windows,
                    self.settings.account_settings(obs.account).reserve, self.now)
        if hold is not None:  # the account's window would run out before its reset
            for issue in ready_in(self.world):
                self.wait(issue.identifier, "pacing", hold.why, until=hold.until)
            for cand in (*self.resolves, *self.orphans):
                self.wait(cand.issue.identifier, "pacing", hold.why, until=hold.until)
            return
        self.idle = True
        w = self.world
        s = self.settings
        per_role: Counter[Role] = Counter()
        total = 0
        for ident, windows in w.windows.items():
            rec = w.records.get(ident)
            if rec is not None and rec.done:
                continue  # reported done: its window closes now, merging holds no slot
            if any(win.alive for win in windows):
                per_role[rec.role if rec is not None else Role.EXECUTE] += 1
                total += 1
        dispatch: list[Candidate] = []
        for issue in ready_in(w):
            ident = issue.identifier
            role = w.route(issue)
            rec = w.records.get(ident)
            if w.review_dispatch(issue):
                why = f"{ident} is in {s.review_state!r} with no reviewer yet"
            else:
                why = (f"{ident} is ready: priority {issue.priority} "
                       f"({PRIORITY_NAMES.get(issue.priority, 'unknown')}), no unfinished blockers")
            if rec is None or rec.done or w.review_dispatch(issue):
                dispatch.append(Candidate(issue, role, 1, why))
            else:
                # Tried before (moved back to Todo, or its start never stuck): the
                # attempt cap and backoff still apply, so nothing loops forever.
                self.retry(ident, issue, role, f"{why}, tried before", dispatch)
        queue = [*self.resolves, *sorted(self.orphans, key=lambda c: dispatch_key(c.issue)),
                 *dispatch]
        self.probe_key(len(queue))
        self.idle = not queue and total < s.limits.max_workers
        wanted = len(queue)
        placeable = w.observed.cluster_slots
        on_host = self.host_share(total, queue)
        short = 0
        for cand in queue:
            ident = cand.issue.identifier
            if (until := self.lease_runs(ident)) is not None:
                host = w.records[ident].host or "unknown"
                self.wait(ident, "lease", f"its last attempt's host ({host}) has not "
                                          "answered since; it stops that agent itself "
                                          "when the lease runs out", until=until)
                continue
            if total >= s.limits.max_workers:
                self.wait(ident, "slot", f"{wanted} issue(s) want a worker; {total}/"
                                         f"{s.limits.max_workers} workers busy")
                continue
            if placeable is not None and placeable <= 0:
                short += 1
                self.wait(ident, "slot", f"{wanted} issue(s) want a worker; no host of the "
                                         "cluster has a free ralph_worker slot"
                                         f"{self.hosts_asked(total, short)}")
                continue
            if on_host is not None and on_host <= 0:
                self.wait(ident, "slot", f"{wanted} issue(s) want a worker; "
                                         f"{self.host_full(total)}")
                continue
            if per_role[cand.role] >= self.role_cap(cand.role):
                self.wait(ident, "slot", f"the {cand.role.value} role is at its limit "
                                         f"({self.role_cap(cand.role)} at once)")
                continue
            per_role[cand.role] += 1
            total += 1
            if placeable is not None:
                placeable -= 1
            if on_host is not None:
                on_host -= 1
            self.emit(
                Spawn(
                    cand.issue.identifier,
                    f"{cand.reason}; starting a worker, role {cand.role.value} "
                    f"({total}/{s.limits.max_workers} workers)",
                    role=cand.role,
                    attempt=cand.attempt,
                    model=model_for(cand.issue, cand.role, s),
                )
            )

        if placeable is not None:
            self.slots_wanted = self.slots_to_ask(total, short)

    def probe_key(self, wanting: int) -> None:
        """Ask for the API key's limits while ``wanting`` issues want a worker and no
        project on the account asked within the minute: starts are paced by what the
        API says of the key, which its agent passes on nowhere."""
        obs = self.world.observed
        last = obs.account_probed_at
        if not wanting or not obs.key_account \
                or (last is not None and last <= self.now < last + KEY_PROBE_EVERY):
            return
        read = "never read" if last is None else f"last read at {last:%H:%M:%S} UTC"
        self.emit(ProbeAccount(SWARM, f"{wanting} issue(s) want a worker; the API key's "
                                      f"per-minute limits were {read}: asking the API once"))

    def slots_to_ask(self, used: int, short: int) -> int:
        """Worker slots the cluster's autoscaler is asked to make room for, ``used`` of
        them running and ``short`` more wanted: none while nothing waits (the request is
        withdrawn, and idle hosts go), else all of them, within ``limits.max_workers``
        and ``cluster.max_hosts`` hosts of the largest live host's size."""
        if short <= 0:
            return 0
        cap = self.settings.limits.max_workers
        cluster = self.settings.cluster
        if cluster is not None and cluster.max_hosts is not None:
            cap = min(cap, cluster.max_hosts * max(self.world.observed.host_slots, 1))
        return max(min(used + short, cap), used)

    def hosts_asked(self, used: int, short: int) -> str:
        """What a wait for a cluster slot says of the autoscaler."""
        if self.slots_to_ask(used, short) > used:
            return "; Ray's autoscaler is asked for more hosts"
        cluster = self.settings.cluster
        return (f"; no more hosts are asked for (cluster.max_hosts = {cluster.max_hosts})"
                if cluster is not None and cluster.max_hosts is not None else "")

    def host_share(self, used: int, queue: Sequence[Candidate]) -> int | None:
        """How many of ``queue`` the host's other projects leave this one to start now
        (None: no ``[host] max_workers``); the project's load, for them to see, becomes
        the plan's (``Plan.load``)."""
        s, others = self.settings, self.world.observed.host_loads
        if others is None or s.host.max_workers is None:
            return None
        top = min((c.issue.priority for c in queue), key=urgency, default=NO_PRIORITY)
        self.load = ProjectLoad(used=used, wanting=len(queue), top_priority=top,
                                share=s.share)
        return host_allowance(s.name, {**others, s.name: self.load}, s.host.max_workers)

    def host_full(self, used: int) -> str:
        """Why no more of this project's workers start on the host, ``used`` of them
        running or starting."""
        s, others = self.settings, self.world.observed.host_loads or {}
        max_workers = s.host.max_workers or 0
        loads = {**others, s.name: ProjectLoad(used=used)}
        said = f"{host_said(loads, max_workers)} ([host] max_workers)"
        if sum(load.used for load in loads.values()) < max_workers:
            said += ("; its free places go first to projects with more urgent issues or "
                     "below their share")
        return said

    def lease_runs(self, ident: str) -> datetime | None:
        """Until when the issue's last cluster attempt may still run, if its host never
        answered its end (lost, cut off): no next attempt starts before."""
        rec, cluster_settings = self.world.records.get(ident), self.settings.cluster
        if rec is None or cluster_settings is None or rec.lease_renewed_at is None \
                or rec.final_push == rec.host_attempt:
            return None
        until = lease_ends(rec.lease_renewed_at, cluster_settings.lease)
        return until if until > self.now else None

    def blocked_waits(self) -> None:
        """An issue that would be ready but for a blocker says which one it waits on."""
        w = self.world
        for issue in w.issues.values():
            if not w.ready_but_for_blockers(issue):
                continue
            blocker = w.blocker_of(issue)
            if blocker is not None:
                seen = w.issues.get(blocker)
                where = ("not visible here" if seen is None
                         else f"{seen.state_name!r}, its work not all in trunk yet"
                         if seen.state_type.finished else f"in {seen.state_name!r}")
                self.wait(issue.identifier, "blocked", f"waits for its blocker {blocker} "
                                                       f"({where})")

    def role_cap(self, role: Role) -> int:
        """Workers of ``role`` at most at once: its limit, and one groom worker at most."""
        cap = self.settings.role_limit(role)
        return min(cap, 1) if role is Role.GROOM else cap

    def groom_due(self) -> str:
        """Why ralph-dev should open a groom run now ("" = it should not).

        By itself only (a person's ``ralph:groom`` issue is dispatched like any ready
        issue): when ``groom.when_idle`` and workers could start but nothing is ready
        or waiting, or when ``groom.interval`` has passed since the last run; never
        sooner than ``groom.min_interval`` after the last one, never while a groom
        issue is open (running, waiting or held: at most one at a time), never while
        the swarm is paused or the tracker unread.
        """
        g, w = self.settings.groom, self.world
        if not (g.when_idle or g.interval > 0) or not self.tracker_ok or self.paused \
                or self.role_cap(Role.GROOM) < 1:
            return ""
        label = self.settings.labels.groom
        groom_issues = [i for i in w.issues.values() if not i.foreign and w.has(i.identifier,
                                                                               label)]
        if any(not i.state_type.finished for i in groom_issues):
            return ""
        starts = [aware(i.created_at) for i in groom_issues if i.created_at is not None]
        starts += [aware(r.started_at) for r in w.records.values()
                   if r.role is Role.GROOM and r.started_at is not None]
        since = seconds(self.now, max(starts)) if starts else None
        if since is not None and since < g.min_interval:
            return ""
        last = "no groom run yet" if since is None else f"the last groom run began {since:.0f}s ago"
        if g.interval > 0 and (since is None or since >= g.interval):
            return f"{last} (groom.interval {g.interval:g}s)"
        if g.when_idle and self.idle:
            return (f"workers could start but no issue is ready, and {last} "
                    f"(groom.when_idle, groom.min_interval {g.min_interval:g}s)")
        return ""


