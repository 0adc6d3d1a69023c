"""The pure decision core: what ralph-dev should do, given one look at the world.

The controller can be killed at any moment and started again, so every rule
is a function of what is observed *now* (level-triggered): the same world
always gives the same plan, and a world in which the plan was carried out
gives a plan that does not repeat it. Nothing here does I/O, reads a clock or
logs, so a test can build a world by hand and check every rule as data.

The rules rely on the executor leaving the world exactly as the executor
contract says (``core.contract.EXECUTOR_CONTRACT``, checked against the real
controller by tests/test_executor_contract.py).

Text from issues (titles, descriptions, comments) never appears in an action:
reasons and nudges name issues only by their checked identifier.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.critical_path import work_behind
from ralph_dev.core.groom import PRIORITY_NAMES
from ralph_dev.core.model import (
    CONTROLLER_WINDOW,
    IDENTIFIER_RE,
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
    Role,
    Spawn,
    StateType,
    Window,
    WorkerRecord,
    Workspace,
)

__all__ = [
    "COLUMNS",
    "NUDGE_MESSAGE",
    "backoff_seconds",
    "blocked_issues",
    "decide",
    "dispatch_key",
    "issue_columns",
    "model_for",
    "nudge_message",
    "ready_issues",
    "route",
]

NUDGE_MESSAGE = (
    "ralph-dev: no activity for a while. Continue working on {issue}. "
    "When it is finished run: ralph-dev worker done {issue} --summary '...'; "
    "if you cannot go on without a person run: ralph-dev worker blocked {issue} --question '...'"
)
"""The only text ever typed into a worker's pane by decide: fixed, never issue text."""


_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,99}$")
"""What a ``model:X`` label value may be: it becomes one argv element of the agent."""

_MAX_EXPONENT = 60
"""Backoff exponent clamp: a corrupt attempt count must not overflow a float."""


def nudge_message(identifier: str) -> str:
    return NUDGE_MESSAGE.format(issue=identifier)


def backoff_seconds(attempts: int, settings: ProjectSettings) -> float:
    """Wait after ``attempts`` spawns before the next one: base·2^(n-1), capped; 0 before any."""
    t = settings.timing
    if attempts < 1:
        return 0.0
    return float(min(t.retry_cap, t.retry_base * 2 ** min(attempts - 1, _MAX_EXPONENT)))


def _aware(dt: datetime) -> datetime:
    """Naive times are taken as UTC so a stray naive value cannot crash a tick."""
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt


def _seconds(later: datetime, earlier: datetime) -> float:
    return (_aware(later) - _aware(earlier)).total_seconds()


def _id_key(identifier: str) -> tuple[str, int]:
    """Natural order: DEMO-9 before DEMO-10."""
    prefix, _, number = identifier.rpartition("-")
    return (prefix, int(number) if number.isdigit() else 0)


def _prefix(identifier: str) -> str:
    return identifier.rpartition("-")[0]


def dispatch_key(issue: Issue) -> tuple[int, float, tuple[int, float], tuple[str, int]]:
    """Priority 1..4 first and 0 (none) last, then sort order, then age, then identifier."""
    rank = issue.priority if 1 <= issue.priority <= 4 else 5
    created = (0, _aware(issue.created_at).timestamp()) if issue.created_at else (1, 0.0)
    return (rank, issue.sort_order, created, _id_key(issue.identifier))


def _label_set(labels: Iterable[str]) -> frozenset[str]:
    return frozenset(label.casefold() for label in labels)


def _model_label(issue: Issue, prefix: str) -> str | None:
    """The value of a ``model:X`` label, if it is a sane model name (labels are data)."""
    wanted = prefix.casefold()
    for label in sorted(issue.labels):
        if label.casefold().startswith(wanted):
            value = label[len(prefix):].strip()
            if _MODEL_RE.match(value):
                return value
    return None


def model_for(issue: Issue, role: Role, settings: ProjectSettings) -> str:
    """A ``model:X`` label wins, then the per-role setting, then the default model."""
    from_label = _model_label(issue, settings.labels.model_prefix)
    if from_label:
        return from_label
    return settings.agent.models.get(role.value) or settings.agent.model


# --- the indexed world -------------------------------------------------------------


@dataclass
class _World:
    """``Observed`` indexed by identifier once, so a tick over 5,000 issues stays cheap."""

    observed: Observed
    settings: ProjectSettings
    issues: dict[str, Issue] = field(default_factory=dict)
    labels: dict[str, frozenset[str]] = field(default_factory=dict)
    children: dict[str, set[str]] = field(default_factory=dict)
    windows: dict[str, list[Window]] = field(default_factory=dict)
    workspaces: dict[str, Workspace] = field(default_factory=dict)
    records: dict[str, WorkerRecord] = field(default_factory=dict)

    @classmethod
    def build(cls, observed: Observed, settings: ProjectSettings) -> _World:
        world = cls(observed, settings)
        for issue in observed.issues:
            ident = issue.identifier
            if ident not in world.issues and isinstance(ident, str) and (
                IDENTIFIER_RE.fullmatch(ident)
            ):
                world.issues[ident] = issue
                world.labels[ident] = _label_set(issue.labels)
        for ident, issue in world.issues.items():
            for child in issue.children:
                world.children.setdefault(ident, set()).add(child)
            if issue.parent:
                world.children.setdefault(issue.parent, set()).add(ident)
        records: Mapping[str, WorkerRecord] = observed.records or {}
        for ident, record in records.items():
            if isinstance(ident, str) and IDENTIFIER_RE.fullmatch(ident):
                world.records[ident] = record
        # A worker window is named by an identifier of this project: its key, or
        # the key of any issue or record we know (Linear team keys may differ).
        keys = {settings.key} | {_prefix(i) for i in world.issues} | {
            _prefix(i) for i in world.records
        }

        def ours(name: str) -> bool:
            return (
                isinstance(name, str)
                and name != CONTROLLER_WINDOW
                and bool(IDENTIFIER_RE.fullmatch(name))
                and _prefix(name) in keys
            )

        for window in observed.windows:
            if ours(window.name):
                world.windows.setdefault(window.name, []).append(window)
        for ws in observed.workspaces:
            if ours(ws.name) and ws.name not in world.workspaces:
                world.workspaces[ws.name] = ws
        return world

    # -- small questions --------------------------------------------------------

    def has(self, ident: str, label: str) -> bool:
        return label.casefold() in self.labels.get(ident, frozenset())

    def held(self, ident: str) -> bool:
        lab = self.settings.labels
        return self.has(ident, lab.hold) or self.has(ident, lab.user_input_needed)

    def feedback(self, ident: str) -> bool:
        return self.has(ident, self.settings.labels.user_feedback_given)

    def finished(self, ident: str) -> bool:
        issue = self.issues.get(ident)
        return issue is not None and issue.state_type.finished

    def settled(self, ident: str, _seen: frozenset[str] = frozenset()) -> bool:
        """Finished, and its work is in trunk: what a dependent may build on.

        A completed issue whose change still waits for its merge is not settled
        (a dependent's workspace starts from trunk and would miss that change),
        and neither is a parent while any child is unsettled.
        """
        if not self.finished(ident) or ident in _seen:
            return self.finished(ident)
        issue = self.issues[ident]
        ws = self.workspaces.get(ident)
        if (issue.state_type == StateType.COMPLETED and ws is not None
                and (ws.has_unmerged_change or ws.conflicted)):
            return False
        seen = _seen | {ident}
        return all(self.settled(kid, seen) for kid in self.kids(ident))

    def live(self, ident: str) -> bool:
        return any(w.alive for w in self.windows.get(ident, ()))

    def in_review_state(self, issue: Issue) -> bool:
        return issue.state_name.casefold() == self.settings.review_state.casefold()

    def kids(self, ident: str) -> set[str]:
        return self.children.get(ident, set())

    def blocker_of(self, issue: Issue) -> str | None:
        """The first unsettled issue that blocks ``issue`` or one of its ancestors.

        A blocker we cannot see counts as unfinished: dispatching too late is
        cheap, dispatching work before its prerequisite is in trunk is not.
        """
        seen: set[str] = set()
        current: Issue | None = issue
        while current is not None and current.identifier not in seen:
            seen.add(current.identifier)
            for blocker in sorted(current.blocked_by, key=_blocker_key):
                if not self.settled(blocker):
                    return blocker
            current = self.issues.get(current.parent) if current.parent else None
        return None

    def sent_back(self, ident: str) -> bool:
        """Its finished change failed the verify command on top of trunk (the verified
        merge lane) and waits for a worker of the issue to fix it."""
        rec = self.records.get(ident)
        return rec is not None and rec.sent_back is not None and not rec.done

    def route(self, issue: Issue) -> Role:
        lab = self.settings.labels
        ident = issue.identifier
        ws = self.workspaces.get(ident)
        if ws is not None and ws.conflicted:
            return Role.RESOLVE
        if ws is not None and self.sent_back(ident):
            return Role.EXECUTE  # its change failed verify on trunk: its worker redoes it
        if self.has(ident, lab.groom):
            return Role.GROOM
        if self.has(ident, lab.plan) or (self.has(ident, lab.phase) and not self.kids(ident)):
            return Role.PLAN
        if self.in_review_state(issue) or self.has(ident, lab.review):
            return Role.REVIEW
        if self.has(ident, lab.research) or self.has(ident, lab.agent_input_needed):
            return Role.RESEARCH
        return Role.EXECUTE

    def review_dispatch(self, issue: Issue) -> bool:
        """In the review state with no worker of its own yet: review it (not an orphan).

        A done record of another role (the execute worker that moved it to
        review) does not count as the reviewer's.
        """
        if not self.in_review_state(issue) or issue.state_type.finished:
            return False
        rec = self.records.get(issue.identifier)
        return rec is None or (rec.done and rec.role != Role.REVIEW)

    def dispatchable(self, issue: Issue) -> bool:
        """Ready for a first worker, limits aside (the rule 6 list)."""
        ident = issue.identifier
        if issue.foreign:
            return False  # another project's: seen only as a blocker, child or parent
        if issue.state_type.finished or self.held(ident) or self.feedback(ident):
            return False
        if ident in self.windows or self.kids(ident):
            return False
        rec = self.records.get(ident)
        if self.review_dispatch(issue):
            if ident in self.workspaces and rec is not None and rec.done:
                return False  # the done path still has to merge and forget it first
        elif issue.state_type != StateType.UNSTARTED:
            return False
        elif rec is not None and rec.done and ident in self.workspaces:
            return False  # reopened before its done work was merged: that goes first
        return self.blocker_of(issue) is None


def _blocker_key(ident: str) -> tuple[str, int]:
    return _id_key(ident) if IDENTIFIER_RE.fullmatch(ident) else (ident, 0)


# --- public helpers for status / plan ------------------------------------------------


def route(issue: Issue, observed: Observed, settings: ProjectSettings) -> Role:
    """The role a worker for ``issue`` gets (rule 7).

    Looks only at what routing needs (the issue's workspace and children), so
    ``status`` may call it once per worker without indexing the whole world.
    """
    ident = issue.identifier
    world = _World(observed, settings)
    world.labels[ident] = _label_set(issue.labels)
    kids = set(issue.children) | {i.identifier for i in observed.issues if i.parent == ident}
    if kids:
        world.children[ident] = kids
    ws = next((w for w in observed.workspaces if w.name == ident), None)
    if ws is not None:
        world.workspaces[ident] = ws
    return world.route(issue)


def ready_issues(observed: Observed, settings: ProjectSettings) -> tuple[Issue, ...]:
    """Issues a new worker would start on, in dispatch order, before limits."""
    world = _World.build(observed, settings)
    return _ready(world)


def _ready(world: _World) -> tuple[Issue, ...]:
    """Dispatch order: priority, then the critical path (the most unfinished work waiting
    behind an issue, ``core.critical_path``), then the person's sort order and age."""
    found = [issue for issue in world.issues.values() if world.dispatchable(issue)]
    if not found:
        return ()
    behind = work_behind(world.issues.values())

    def key(issue: Issue) -> tuple[object, ...]:
        rank, sort_order, created, ident = dispatch_key(issue)
        chain, count = behind.get(issue.identifier, (0, 0))
        return (rank, -chain, -count, sort_order, created, ident)

    return tuple(sorted(found, key=key))


def blocked_issues(observed: Observed, settings: ProjectSettings) -> tuple[Issue, ...]:
    """Unfinished issues waiting on an unfinished blocker (their own or an ancestor's)."""
    world = _World.build(observed, settings)
    found = [
        issue
        for issue in world.issues.values()
        if not issue.foreign and not issue.state_type.finished
        and world.blocker_of(issue) is not None
    ]
    return tuple(sorted(found, key=dispatch_key))


COLUMNS = ("held", "ready", "running", "blocked", "waiting", "done")
"""Where ``status`` and the dashboard put each issue: held (a person must act), ready
(dispatch takes it when a slot frees), running (started or has a live worker), blocked
(an unsettled blocker), waiting (anything else unfinished: a parent waiting for its
children, a backlog state, a finished worker waiting for its merge), done (finished)."""


def issue_columns(observed: Observed, settings: ProjectSettings
                  ) -> dict[str, tuple[str, str | None]]:
    """Each issue's column (one of ``COLUMNS``) and, for a blocked one, the first
    unsettled issue that blocks it (its own blocker or an ancestor's)."""
    world = _World.build(observed, settings)
    ready = {issue.identifier for issue in _ready(world)}
    columns: dict[str, tuple[str, str | None]] = {}
    for ident, issue in world.issues.items():
        if issue.foreign:
            continue
        blocker = None
        if issue.state_type.finished:
            column = "done"
        elif world.held(ident):
            column = "held"
        elif ident in ready:
            column = "ready"
        elif world.live(ident) or issue.state_type == StateType.STARTED:
            column = "running"
        elif (blocker := world.blocker_of(issue)) is not None:
            column = "blocked"
        else:
            column = "waiting"
        columns[ident] = (column, blocker)
    return columns


# --- decide ----------------------------------------------------------------------


@dataclass
class _Candidate:
    """A spawn waiting for a free slot (limits are applied after every issue is seen)."""

    issue: Issue
    role: Role
    attempt: int
    reason: str


@dataclass
class _Decider:
    world: _World
    now: datetime
    actions: list[Action] = field(default_factory=list)
    resolves: list[_Candidate] = field(default_factory=list)
    orphans: list[_Candidate] = field(default_factory=list)
    merged: bool = False
    idle: bool = False
    """Workers could start and no issue waits for one (``groom.when_idle``)."""

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
        return bool(self.world.observed.pauses)

    @property
    def workers_waiting(self) -> bool:
        return any(p.quiet_workers for p in self.world.observed.pauses)

    def emit(self, *actions: Action) -> None:
        self.actions.extend(actions)

    def take_merge_slot(self) -> bool:
        """Merges run one at a time, in identifier order. When merges are verified (before
        or after trunk moves) only one goes per plan: the next tick takes the next."""
        if self.merged and (self.settings.merge.verify_trunk or self.settings.verifies_merges):
            return False
        self.merged = True
        return True

    def merge_backing_off(self, ident: str) -> bool:
        """A failed merge waits base·2^(n-1) before the next try, so one failing issue
        neither loops every tick nor keeps the merge slot from the issues behind it."""
        rec = self.world.records.get(ident)
        if rec is None or not rec.merge_failures or rec.merge_failed_at is None:
            return False
        wait = backoff_seconds(rec.merge_failures, self.settings)
        return self.now < _aware(rec.merge_failed_at) + timedelta(seconds=wait)

    def attempts(self, ident: str) -> int:
        rec = self.world.records.get(ident)
        return rec.attempts if rec is not None else 0

    # -- the per-issue tree ---------------------------------------------------------

    def issue_chain(self, ident: str) -> None:
        w = self.world
        issue = w.issues.get(ident)
        rec = w.records.get(ident)
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
        if self.trunk_red:
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
        if rec is not None and not rec.role.may_edit:
            # review, research, plan and groom workers change no code: whatever their
            # workspace holds (Bash can write files) never reaches trunk; it stays
            # reachable under its bookmark for a person to look at
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
        if self.merge_backing_off(ident):
            return  # its last merge failed: retried after a backoff, not holding the slot
        if not self.take_merge_slot():
            return  # trunk is verified after each merge: this one goes next tick
        change = "its change" if ws.has_unmerged_change else "whatever it holds"
        self.emit(Merge(ident, f"{why}: merging {change} into trunk"))
        self.emit(Forget(ident, f"{why}: forgetting its workspace (after the merge)"))

    def zombie(self, ident: str) -> None:
        ws = self.world.workspaces.get(ident)
        why = f"{ident} is completed but its worker is still running"
        if ws is None:
            self.emit(Kill(ident, f"{why}: closing its window"))
        elif self.trunk_red or ws.conflicted:
            waits = "trunk is red" if self.trunk_red else "it conflicts with trunk"
            self.emit(Kill(ident, f"{why}: closing its window; its change waits ({waits})"))
        else:
            self.merge_chain(ident, ws, why, has_window=True)

    def finished(self, ident: str, issue: Issue) -> None:
        """Completed, no done marker, no live window: merge/forget what is left."""
        w = self.world
        ws = w.workspaces.get(ident)
        has_window = ident in w.windows
        why = f"{ident} is completed"
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
        self, ident: str, issue: Issue, role: Role, what: str, queue: list[_Candidate]
    ) -> None:
        """Cap → Hold; backoff not elapsed → wait; else queue a spawn of attempt n+1.

        A worker lost for a cause outside the issue (its tmux session went away) is
        started again at once, as the same attempt: nothing is charged for it.
        """
        if self.paused:
            return  # nothing starts, nothing is held at the cap, while the swarm is paused
        rec = self.world.records.get(ident)
        attempts = self.attempts(ident)
        cap = self.settings.timing.max_attempts
        if rec is not None and rec.lost:
            queue.append(_Candidate(issue, role, max(attempts, 1),
                                    f"{ident}: {what}; its worker was lost ({rec.lost[:120]}), "
                                    f"no attempt charged ({max(attempts, 1)}/{cap})"))
            return
        if attempts >= cap:
            self.hold(ident, what)
            return
        wait = backoff_seconds(attempts, self.settings)
        if rec is not None and rec.last_failure_at is not None and wait > 0:
            if _seconds(self.now, rec.last_failure_at) < wait:
                return  # backing off; the next tick looks again
            backoff = f" after {wait:g}s backoff"
        else:
            backoff = ""
        last = f" (last failure: {rec.last_failure[:120]})" if rec and rec.last_failure else ""
        queue.append(
            _Candidate(
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
            f" at {_aware(rec.last_failure_at).isoformat(timespec='seconds')}"
            if rec is not None and rec.last_failure_at
            else ""
        )
        comment = (
            f"ralph-dev stopped retrying {ident} after {attempts}/{cap} attempts "
            f"({what}). Last failure: {last[:300]}{when}. To retry, add a comment "
            f"and the label {self.settings.labels.user_feedback_given!r}."
        )
        self.emit(Hold(ident, f"{ident}: {what}; attempt cap {cap} reached, holding it",
                       comment=comment))

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
                    self.emit(RelayFeedback(ident, f"{ident}: a person gave feedback; handing "
                                                   "it to the running worker"))
                return
            if windows:
                self.reap(ident, windows)
            self.resume(ident)
            return
        if w.held(ident):
            return  # held: a person has to answer first; never nudge or respawn
        if windows and not live:
            self.reap(ident, windows)
            return
        if live:
            self.live_worker(ident, issue)
            return
        if w.kids(ident):
            self.parent_or_review(ident, issue)
            return
        if issue.state_type != StateType.STARTED or w.review_dispatch(issue):
            return  # unstarted and review dispatches are collected by _ready
        if not self.tracker_ok or ident in w.observed.relaying:
            return  # its worker's report still owes the tracker a write: the state is stale
        blocker = w.blocker_of(issue)
        if blocker is not None:
            return  # started but blocked again: wait for the blocker like dispatch does
        self.retry(ident, issue, w.route(issue), "no worker is running for it", self.orphans)

    def reap(self, ident: str, windows: list[Window]) -> None:
        statuses = [win.exit_status for win in windows if win.exit_status is not None]
        status = statuses[0] if statuses else None
        shown = f"exit {status}" if status is not None else "exit status unknown"
        self.emit(Reap(ident, f"{ident}: pane died ({shown}) without a done marker; closing it, "
                              "a retry follows after backoff", exit_status=status))

    def live_worker(self, ident: str, issue: Issue) -> None:
        """Stuck detection: nudge once after stall_timeout, restart after restart_timeout."""
        if self.workers_waiting:
            return  # waiting out a usage limit or an outage with everyone else: not stuck
        w = self.world
        timing = self.settings.timing
        rec = w.records.get(ident)
        seen = [
            win.output_changed_at or win.last_activity
            for win in w.windows.get(ident, [])
            if win.alive
        ]
        stamps = [_aware(t) for t in seen if t is not None]
        changed = max(stamps) if stamps else (rec.started_at if rec else None)
        if changed is None:
            return
        idle = _seconds(self.now, changed)
        if idle <= timing.stall_timeout:
            return
        nudged = rec.nudged_at if rec is not None else None
        # Typing the nudge changes the pane, and the observer notices it a tick
        # later: output that changed only that soon after a nudge is its echo.
        echo = 2 * timing.poll_interval + 5
        if nudged is None or _seconds(changed, nudged) > echo:
            self.emit(Nudge(ident, f"{ident}: no activity for {idle:.0f}s "
                                   f"(stall timeout {timing.stall_timeout:g}s); nudging",
                            message=nudge_message(ident)))
            return
        since = _seconds(self.now, nudged)
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

    def unknown(self, ident: str) -> None:
        """An identifier with no issue (tracker down, or not in this project): tidy only."""
        windows = self.world.windows.get(ident, [])
        if windows and not self.world.live(ident):
            self.reap(ident, windows)

    # -- spawns under limits ------------------------------------------------------

    def spawns(self) -> None:
        if not self.tracker_ok or self.paused:
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
        dispatch: list[_Candidate] = []
        for issue in _ready(w):
            ident = issue.identifier
            role = w.route(issue)
            rec = w.records.get(ident)
            if w.review_dispatch(issue):
                why = f"{ident} is in {s.review_state!r} with no reviewer yet"
            else:
                why = (f"{ident} is ready: priority {issue.priority} "
                       f"({PRIORITY_NAMES.get(issue.priority, 'unknown')}), no unfinished blockers")
            if rec is None or rec.done or w.review_dispatch(issue):
                dispatch.append(_Candidate(issue, role, 1, why))
            else:
                # Tried before (moved back to Todo, or its start never stuck): the
                # attempt cap and backoff still apply, so nothing loops forever.
                self.retry(ident, issue, role, f"{why}, tried before", dispatch)
        queue = [*self.resolves, *sorted(self.orphans, key=lambda c: dispatch_key(c.issue)),
                 *dispatch]
        self.idle = not queue and total < s.limits.max_workers
        for cand in queue:
            if total >= s.limits.max_workers:
                break
            if per_role[cand.role] >= self.role_cap(cand.role):
                continue
            per_role[cand.role] += 1
            total += 1
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
        starts = [_aware(i.created_at) for i in groom_issues if i.created_at is not None]
        starts += [_aware(r.started_at) for r in w.records.values()
                   if r.role is Role.GROOM and r.started_at is not None]
        since = _seconds(self.now, max(starts)) if starts else None
        if since is not None and since < g.min_interval:
            return ""
        last = "no groom run yet" if since is None else f"the last groom run began {since:.0f}s ago"
        if g.interval > 0 and (since is None or since >= g.interval):
            return f"{last} (groom.interval {g.interval:g}s)"
        if g.when_idle and self.idle:
            return (f"workers could start but no issue is ready, and {last} "
                    f"(groom.when_idle, groom.min_interval {g.min_interval:g}s)")
        return ""


def decide(observed: Observed, settings: ProjectSettings, now: datetime) -> Plan:
    """The actions that bring the world to what it should be, each with its reason.

    Order: per-issue upkeep (kill, merge, forget, reap, nudge, restart, hold,
    feedback, complete) by identifier, then spawns — resolve workers, orphan
    respawns, new dispatches — within the global and per-role limits; and whether a
    groom run is due (``Plan.open_groom``).
    """
    world = _World.build(observed, settings)
    decider = _Decider(world, now)
    idents = set(world.issues) | set(world.windows) | set(world.workspaces) | set(world.records)
    for ident in sorted(idents, key=_id_key):
        decider.issue_chain(ident)
    decider.spawns()
    return Plan(tuple(decider.actions), open_groom=decider.groom_due())
