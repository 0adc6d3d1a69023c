"""What ``decide`` asks for: actions, each with its reason, and what each leaves behind.

An action names the issue it is for (``""`` for the swarm as a whole) and why, in
words a person reads in the events. Text from issues never appears in one: reasons
and typed texts name issues only by their checked identifier.

Each action also states the worker-record fields it sets when it succeeds
(:meth:`Action.record_changes`). The actuator (``control.act``) writes exactly
these, and the property tests replay plans with the same method, so the contract
between ``decide`` and the actuator is code both run, not a table beside them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, ClassVar

from ralph_dev.core.host_share import ProjectLoad
from ralph_dev.core.model import Role

STOPPED = "stopped: "
"""Starts a record's ``lost`` when its worker was stopped from outside (``Stop``): the next
start is free, resumes the session, and is told why it stopped."""

SWARM = ""
"""The ``issue`` of an action for the swarm as a whole (a pause, trunk, a groom run)."""


@dataclass(frozen=True)
class Action:
    issue: str
    reason: str

    record_deleted: ClassVar[bool] = False
    """The worker record is deleted when the action succeeds."""

    @property
    def kind(self) -> str:
        return type(self).__name__.lower()

    def details(self) -> dict[str, object]:
        """The action's own fields beyond issue and reason, enums as their values."""
        out: dict[str, object] = {}
        for f in dataclasses.fields(self):
            if f.name not in ("issue", "reason"):
                value = getattr(self, f.name)
                out[f.name] = value.value if isinstance(value, Enum) else value
        return out

    def record_changes(self, now: datetime) -> dict[str, Any]:
        """The worker-record fields this action sets when it succeeds."""
        return {}

    def issues(self) -> tuple[str, ...]:
        """Every issue the action is for: a failure stops each one's chain in the plan."""
        return (self.issue,) if self.issue else ()

    def touches(self) -> tuple[str, ...]:
        """Every issue whose workspace the action may change (the tripwires are told)."""
        return self.issues()


@dataclass(frozen=True)
class Spawn(Action):
    """Create (or reuse) the issue's workspace, open its window, mark it started."""

    role: Role = Role.EXECUTE
    attempt: int = 1
    model: str | None = None
    cli: str = ""
    """The agent CLI the worker runs (a profile's name, or ``command``; ``decide``)."""
    resume: str | None = None
    """The agent session this start continues (``decide``: the last one of the same role
    whose transcript is kept); None: a fresh session."""
    fresh_why: str = ""
    """Why an earlier session of the same role is not resumed (said as an event)."""
    start_issue: bool = False
    """Move the issue to its started state (it was not started yet)."""

    def record_changes(self, now: datetime) -> dict[str, Any]:
        return _started(self.role, self.attempt, now)


@dataclass(frozen=True)
class Restart(Action):
    """Kill the window and start the same role again, in the same agent session where
    it can. ``charged``: the restart is the issue's own failure (a silent worker); a
    restart for a cause outside it (a hang, an outage) keeps the attempt count."""

    role: Role = Role.EXECUTE
    attempt: int = 1
    model: str | None = None
    cli: str = ""
    """The agent CLI the worker runs (a profile's name, or ``command``; ``decide``)."""
    charged: bool = True
    hangs: int | None = None
    """A restart for a hung model call: the worker's count of those, this one included."""
    resume: str | None = None
    """The agent session this start continues (``decide``: the last one of the same role
    whose transcript is kept); None: a fresh session."""
    fresh_why: str = ""
    """Why an earlier session of the same role is not resumed (said as an event)."""
    start_issue: bool = False
    """Move the issue to its started state (it was not started yet)."""
    bring_in: bool = False
    """Its done work comes into the issue's workspace here once its window ends (a
    worker on another host): what ``decide`` weighs next is that workspace."""

    def record_changes(self, now: datetime) -> dict[str, Any]:
        failure = {"last_failure_at": now, "last_failure": self.reason} if self.charged else {}
        hangs = {} if self.hangs is None else {"hang_restarts": self.hangs}
        return {**_started(self.role, self.attempt, now), **failure, **hangs}


def _started(role: Role, attempt: int, now: datetime) -> dict[str, Any]:
    """A worker's start: what every new start of an issue's worker resets."""
    return {"role": role, "attempts": attempt, "started_at": now, "done": False,
            "blocked": False, "nudged_at": None, "iterations": 0, "lost": None,
            "hold_reason": None, "merged_at": None, "last_refusal": None, "gave_up": None}


@dataclass(frozen=True)
class Nudge(Action):
    """Type a short, fixed reminder into a live but silent worker's pane."""

    message: str = ""

    def record_changes(self, now: datetime) -> dict[str, Any]:
        return {"nudged_at": now}


@dataclass(frozen=True)
class Kill(Action):
    """Kill the issue's window (a zombie, after a merge, a worker a person stopped)."""

    bring_in: bool = False
    """Its done work comes into the issue's workspace here once its window ends (a
    worker on another host): what ``decide`` weighs next is that workspace."""


@dataclass(frozen=True)
class Stop(Action):
    """Stop the issue's worker for a cause outside its work — a person's hold or state
    move, a budget, a tripwire: its workspace is snapshotted first and kept, and so is its
    agent session, so the issue's next start is free and resumes that session, told
    ``why`` it stopped."""

    cause: str = ""
    """What stopped it, in one word: ``hold``, ``state``, ``budget``, ``tripwire``."""
    why: str = ""
    bring_in: bool = False
    """Its done work comes into the issue's workspace here once its window ends (a
    worker on another host): what ``decide`` weighs next is that workspace."""

    def record_changes(self, now: datetime) -> dict[str, Any]:
        return {"lost": f"{STOPPED}{self.why}"[:500], "lost_at": now, "nudged_at": None}


@dataclass(frozen=True)
class Reap(Action):
    """Kill a worker window whose pane died without a done marker and record the
    failure time (the orphan backoff counts from it)."""

    exit_status: int | None = None
    charged: bool = True
    """The pane's end is the issue's failure (the orphan backoff counts from it); not so
    for a worker that asked a person and was answered, nor one whose host was lost."""
    lost: str = ""
    """Why the worker was lost for a cause outside the issue: its next start is free."""
    bring_in: bool = False
    """Its done work comes into the issue's workspace here once its window ends (a
    worker on another host): what ``decide`` weighs next is that workspace."""
    forget_session: bool = False
    """The agent session its start resumed is not resumed again (it could not be)."""

    def record_changes(self, now: datetime) -> dict[str, Any]:
        forgotten = {"session_id": None, "resumed": None} if self.forget_session else {}
        if self.lost:
            return {"lost": self.lost[:500], "lost_at": now, **forgotten}
        failure = {"last_failure_at": now, "last_failure": self.reason} if self.charged else {}
        return {**failure, **forgotten}


@dataclass(frozen=True)
class Complete(Action):
    """Move the issue to its completed state (a parent whose children are all finished)."""


@dataclass(frozen=True)
class Merge(Action):
    """Merge the issue's workspace change into trunk (or open its pull request).

    In the verified lane, a change that passed: the batch ``batch`` (this issue among
    them, in order) verified together by the lane's run ``run`` lands at once, trunk
    moving once to the last of them; every one of them is in trunk after any of their
    ``Merge`` actions (the first lands them, the others find them landed)."""

    fetch_attempt: int = 0
    """The attempt whose pushed work comes into the workspace first (a worker on another
    host, whose final push came back); 0: the work is in the workspace already."""
    batch: tuple[str, ...] = ()
    run: str = ""
    verified: str = ""
    """The commit the lane's verify of the batch checked out (what trunk must equal)."""

    def record_changes(self, now: datetime) -> dict[str, Any]:
        return {"merged_at": now}

    def issues(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.issue, *self.batch)))


@dataclass(frozen=True)
class VerifyMerge(Action):
    """Start the merge lane's verify of changes ready to merge, beside the loop: the
    first ``size`` of ``batch`` (in merge order: the person's priority, then identifier),
    each rebased onto trunk, verified together. It replaces the lane's run ``replaces``
    (stopped if it still runs). ``good``/``bad``/``base``: a step of a red batch's
    bisection on trunk's commit ``base`` (0/0/"": a new batch)."""

    batch: tuple[str, ...] = ()
    size: int = 0
    good: int = 0
    bad: int = 0
    base: str = ""
    bad_run: str = ""
    good_commit: str = ""
    replaces: str = ""
    fetch: tuple[tuple[str, int], ...] = ()
    """Changes done on other hosts, each with the attempt whose final push comes into
    its workspace here before it is rebased (``decide``'s orders fill it in)."""
    also: tuple[int, ...] = ()
    """Shorter prefixes of the batch verified at once beside the first ``size``, each by
    a process of its own (``merge.parallel_verifies``): speculative bisection steps."""

    def issues(self) -> tuple[str, ...]:
        return self.batch[:self.size]

    def touches(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.issue, *self.batch)))  # the whole batch is rebased


@dataclass(frozen=True)
class SendBack(Action):
    """The issue's change failed the verify command on top of trunk (the lane's run
    ``run``): it goes back to a worker of its own, with the command's output (the
    record's ``sent_back``, which the lane writes) in its prompt and in a comment;
    ``decide`` starts that worker like a retry, the failure charged."""

    run: str = ""

    def record_changes(self, now: datetime) -> dict[str, Any]:
        return {"done": False, "last_failure_at": now, "last_failure": self.reason[:500]}


@dataclass(frozen=True)
class TrunkVerified(Action):
    """Trunk's verify (the lane's run ``run``) ended: trunk is red at ``commit`` until it
    moves and passes, or green again; the run is over."""

    run: str = ""
    commit: str = ""
    ok: bool = True
    after: tuple[str, ...] = ()


@dataclass(frozen=True)
class Redo(Action):
    """The issue's done work never came back from the host it ran on (lost before its
    final push): a new attempt does it again from its last pushed snapshot, free."""

    def record_changes(self, now: datetime) -> dict[str, Any]:
        return {"done": False, "lost": self.reason[:500], "lost_at": now}


@dataclass(frozen=True)
class Forget(Action):
    """Forget the workspace and remove its directory (its change is safe)."""

    keep_bookmark: bool = False
    """Its change stays reachable under its bookmark: a canceled issue's, and in pull
    request mode every issue's (the pull request's head)."""
    keep_newest_push: bool = False
    """A canceled issue's newest work pushed from another host is taken in first."""

    record_deleted: ClassVar[bool] = True


@dataclass(frozen=True)
class Hold(Action):
    """Stop retrying: label the issue for a person and comment why and how to go on."""

    comment: str = ""

    def record_changes(self, now: datetime) -> dict[str, Any]:
        return {"hold_reason": None}


@dataclass(frozen=True)
class Tell(Action):
    """Say something on the issue for a person, once: the comment starts with ``mark``,
    and a comment of ralph-dev's starting with it is not written again."""

    mark: str = ""
    comment: str = ""


@dataclass(frozen=True)
class PassFeedback(Action):
    """Hand new human comments to a live worker, then drop the feedback label.
    ``lifts_hold``: the issue was held, so its attempt count starts over (a worker that
    asked on its last attempt must not be held again with the answer ignored)."""

    lifts_hold: bool = False

    def record_changes(self, now: datetime) -> dict[str, Any]:
        if self.lifts_hold:
            return {"blocked": False, "attempts": 0, "last_failure_at": None,
                    "nudged_at": None}
        return {"blocked": False}


@dataclass(frozen=True)
class Resume(Action):
    """Lift a hold after human feedback (remove both labels) so dispatch can resume."""

    def record_changes(self, now: datetime) -> dict[str, Any]:
        return {"attempts": 0, "blocked": False, "last_failure_at": None, "nudged_at": None,
                "merge_failures": 0, "merge_failed_at": None, "hold_reason": None,
                "lost": ANSWERED}


ANSWERED = "a person answered"
"""Why a held issue's next worker starts: named in its spawn, which comes at once."""


@dataclass(frozen=True)
class Continue(Action):
    """An agent that stopped on an API error goes on in its own session now that the
    pause it caused is over: its menu dismissed and a fixed text typed (``typed``:
    its pane is live)."""

    after: str = ""
    typed: bool = True

    def record_changes(self, now: datetime) -> dict[str, Any]:
        return {"agent_error": None, "agent_error_text": None, "agent_error_at": None,
                "agent_error_reset_at": None, "last_activity": now, **Waited.changes(now)}


@dataclass(frozen=True)
class Waited(Action):
    """A worker waited out a swarm pause with everyone else (the pause was not its own
    error, so nothing is typed): its stall clock starts again and a nudge from before
    the pause is forgotten, so the pause costs it neither a nudge nor an attempt."""

    def record_changes(self, now: datetime) -> dict[str, Any]:
        return self.changes(now)

    @staticmethod
    def changes(now: datetime) -> dict[str, Any]:
        return {"waited_until": now, "nudged_at": None}


@dataclass(frozen=True)
class Adopt(Action):
    """A live worker started by a release before the worker mailbox: give it its run
    directory (its commands find it by the project and issue its pane knows)."""


@dataclass(frozen=True)
class WriteBack(Action):
    """Make the tracker writes a worker's accepted report owes (``report``: its id)."""

    report: str = ""
    report_kind: str = ""


@dataclass(frozen=True)
class PauseSwarm(Action):
    """Start (or lengthen) a swarm-wide pause of ``pause_kind``: no worker starts, no
    attempt is charged while it lasts."""

    pause_kind: str = ""
    cause: str = ""
    fix: str = ""
    until: datetime | None = None
    quiet_workers: bool = False
    probe: str | None = None
    shared_from: str = ""
    """The project on the same account that met it ("": this project met it)."""
    share_account: bool = False
    """The pause is the account's (an agent's API said it): every project on the account
    pauses with it (``adapters.accounts``)."""


@dataclass(frozen=True)
class EndPause(Action):
    """End the swarm-wide pause of ``pause_kind``."""

    pause_kind: str = ""
    share_account: bool = False
    """The pause was the account's, met here: the other projects on it go on too."""


@dataclass(frozen=True)
class ProbeAccount(Action):
    """Read the account's API-key limits by asking the model API once, beside the loop:
    issues wait to start and the limits were not read within the minute. What it reads
    is the next tick's ``Observed.account_windows``."""


@dataclass(frozen=True)
class VerifyTrunk(Action):
    """Start the verify command on trunk beside the loop: trunk was red and has moved
    since, or merges moved it and ``merge.verify_trunk`` is on (``after``: their issues).
    It replaces the lane's run ``replaces`` (a lost one is started again)."""

    commit: str = ""
    after: tuple[str, ...] = ()
    replaces: str = ""


@dataclass(frozen=True)
class OpenGroom(Action):
    """Create the issue of a groom run (the next tick dispatches it like any other)."""


@dataclass(frozen=True)
class Wait:
    """Why ``decide`` does nothing for an issue now, said as a person reads it in
    ``status``, the state document and the dashboard."""

    kind: str
    """``retry``, ``slot``, ``pause``, ``pacing`` (the account's usage window),
    ``blocked``, ``held``, ``stopped``, ``merge``, ``tracker``, ``lease`` or ``model`` (its
    agent's CLI retries the model API by itself)."""
    why: str
    until: datetime | None = None
    """When it is expected to end by itself (a retry's due time, a pause's end)."""
    attempt: int | None = None
    of: int | None = None
    last_error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "why": self.why,
                "until": self.until.isoformat() if self.until else None,
                "attempt": self.attempt, "of": self.of, "last_error": self.last_error}


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...] = ()
    waits: Mapping[str, Wait] = field(default_factory=dict)
    """Each issue ``decide`` leaves alone this tick for a reason, with the reason."""
    load: ProjectLoad | None = None
    """The project's load on the host, for the other projects on it (``[host]
    max_workers``; None: no host limit, or workers run on a cluster)."""
    slots_wanted: int | None = None
    """Worker slots the cluster's autoscaler is asked to make room for: those in use and
    those waiting issues need (None: not a cluster project; 0: nothing waits for one,
    and the request is withdrawn)."""
    due: datetime | None = None
    """The earliest time after this plan's when something ends by itself (a pause's end,
    a usage limit's reset, a retry's backoff): the loop ticks then, not at its next poll."""

    def __bool__(self) -> bool:
        return bool(self.actions)
