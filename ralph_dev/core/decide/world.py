"""The world as ``decide`` sees it: one tick's ``Observed``, indexed by identifier once, and
the small questions every rule asks of it (held? settled? blocked by what? which role?)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ralph_dev.core.agent_profiles import role_model
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.critical_path import work_behind
from ralph_dev.core.model import (
    CONTROLLER_WINDOW,
    IDENTIFIER_RE,
    SESSION_ENDED,
    Issue,
    Observed,
    Role,
    StateType,
    Window,
    WorkerRecord,
    Workspace,
)

NO_LABELS: frozenset[str] = frozenset()

NUDGE_MESSAGE = (
    "ralph-dev: no activity for a while. Continue working on {issue}. "
    "When it is finished run: ralph-dev worker done {issue} --summary '...'; "
    "if you cannot go on without a person run: ralph-dev worker blocked {issue} --question '...'"
)
"""The only text ever typed into a worker's pane by decide: fixed, never issue text."""


_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,99}$")
"""What a ``model:X`` label value may be: it becomes one argv element of the agent."""

def nudge_message(identifier: str) -> str:
    return NUDGE_MESSAGE.format(issue=identifier)


def aware(dt: datetime) -> datetime:
    """Naive times are taken as UTC so a stray naive value cannot crash a tick."""
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt


def said_since_start(rec: WorkerRecord) -> bool:
    """Whether the worker's agent said anything (its session started, a state, a tool
    call) since its current attempt started: its session's end is not a word."""
    if rec.started_at is None:
        return False
    start = aware(rec.started_at)
    state_at = rec.agent_state_at if rec.agent_state != SESSION_ENDED else None
    return any(t is not None and aware(t) >= start for t in (rec.last_activity, state_at))


def seconds(later: datetime, earlier: datetime) -> float:
    return (aware(later) - aware(earlier)).total_seconds()


@functools.lru_cache(maxsize=16384)
def id_key(identifier: str) -> tuple[str, int]:
    """Natural order: DEMO-9 before DEMO-10. (Kept: a tick sorts every identifier.)"""
    prefix, _, number = identifier.rpartition("-")
    return (prefix, int(number) if number.isdigit() else 0)


def prefix(identifier: str) -> str:
    return identifier.rpartition("-")[0]


def dispatch_key(issue: Issue) -> tuple[int, float, tuple[int, float], tuple[str, int]]:
    """Priority 1..4 first and 0 (none) last, then sort order, then age, then identifier."""
    rank = issue.priority if 1 <= issue.priority <= 4 else 5
    created = (0, aware(issue.created_at).timestamp()) if issue.created_at else (1, 0.0)
    return (rank, issue.sort_order, created, id_key(issue.identifier))


@functools.lru_cache(maxsize=256)
def _folded(label: str) -> str:
    """A configured label as labels are compared (they are few, asked thousands of times
    a tick)."""
    return label.casefold()


def label_set(labels: Iterable[str]) -> frozenset[str]:
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
    return role_model(settings, role)


# --- the indexed world -------------------------------------------------------------


@dataclass
class World:
    """``Observed`` indexed by identifier once, so a tick over 5,000 issues stays cheap."""

    observed: Observed
    settings: ProjectSettings
    issues: dict[str, Issue] = field(default_factory=dict)
    labels: dict[str, frozenset[str]] = field(default_factory=dict)
    children: dict[str, set[str]] = field(default_factory=dict)
    windows: dict[str, list[Window]] = field(default_factory=dict)
    workspaces: dict[str, Workspace] = field(default_factory=dict)
    records: dict[str, WorkerRecord] = field(default_factory=dict)
    _settled_memo: dict[str, bool] = field(default_factory=dict, repr=False)
    _blocker_memo: dict[str, str | None] = field(default_factory=dict, repr=False)
    _ready_memo: dict[str, bool] = field(default_factory=dict, repr=False)
    """Answers already worked out this tick (a world never changes once built): a tick
    asks whether each of thousands of issues is ready, blocked or settled more than
    once. One plain dict per question: the lookup is the hot path of a big tick."""

    def __post_init__(self) -> None:
        lab = self.settings.labels
        self._holds = frozenset({_folded(lab.hold), _folded(lab.user_input_needed)})
        self._feedback = _folded(lab.user_feedback_given)
        self._review = self.settings.review_state
        self._review_folded = self._review.casefold()

    @classmethod
    def build(cls, observed: Observed, settings: ProjectSettings) -> World:
        world = cls(observed, settings)
        for issue in observed.issues:
            ident = issue.identifier
            if ident not in world.issues and isinstance(ident, str) and (
                IDENTIFIER_RE.fullmatch(ident)
            ):
                world.issues[ident] = issue
                world.labels[ident] = label_set(issue.labels)
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
        keys = {settings.key} | {prefix(i) for i in world.issues} | {
            prefix(i) for i in world.records
        }

        def ours(name: str) -> bool:
            return (
                isinstance(name, str)
                and name != CONTROLLER_WINDOW
                and bool(IDENTIFIER_RE.fullmatch(name))
                and prefix(name) in keys
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
        return _folded(label) in self.labels.get(ident, NO_LABELS)

    def held(self, ident: str) -> bool:
        labels = self.labels.get(ident, NO_LABELS)
        return bool(labels) and not self._holds.isdisjoint(labels)

    def feedback(self, ident: str) -> bool:
        labels = self.labels.get(ident, NO_LABELS)
        return bool(labels) and self._feedback in labels

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
        if not _seen:
            found = self._settled_memo.get(ident)
            if found is None:
                found = self._settled_memo[ident] = self._settled(ident)
            return found
        return self._settled(ident, _seen)

    def _settled(self, ident: str, _seen: frozenset[str] = frozenset()) -> bool:
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
        name = issue.state_name
        return name == self._review or name.casefold() == self._review_folded

    def kids(self, ident: str) -> AbstractSet[str]:
        return self.children.get(ident, NO_LABELS)

    def blocker_of(self, issue: Issue) -> str | None:
        """The first unsettled issue that blocks ``issue`` or one of its ancestors.

        A blocker we cannot see counts as unfinished: dispatching too late is
        cheap, dispatching work before its prerequisite is in trunk is not.
        """
        ident = issue.identifier
        if ident not in self._blocker_memo:
            self._blocker_memo[ident] = self._blocker_of(issue)
        return self._blocker_memo[ident]

    def _blocker_of(self, issue: Issue) -> str | None:
        seen: set[str] = set()
        current: Issue | None = issue
        while current is not None and current.identifier not in seen:
            seen.add(current.identifier)
            blockers = current.blocked_by  # in identifier order when there is a choice
            for blocker in (blockers if len(blockers) < 2 else sorted(blockers, key=blocker_key)):
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
        return self.ready_but_for_blockers(issue) and self.blocker_of(issue) is None

    def ready_but_for_blockers(self, issue: Issue) -> bool:
        """Everything but its blockers lets a first worker start: when a blocker does
        not, the person sees it waits on that blocker."""
        found = self._ready_memo.get(issue.identifier)
        if found is None:
            found = self._ready_memo[issue.identifier] = self._ready(issue)
        return found

    def _ready(self, issue: Issue) -> bool:
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
        return True


def blocker_key(ident: str) -> tuple[str, int]:
    return id_key(ident) if IDENTIFIER_RE.fullmatch(ident) else (ident, 0)


def ready_in(world: World) -> tuple[Issue, ...]:
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


