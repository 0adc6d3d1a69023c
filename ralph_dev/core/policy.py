"""One failure policy and one retry policy: where every failure ends.

Every failure ralph-dev meets is one of three kinds (:class:`Blame`), and the kind
alone says what happens next:

* **outside** the issue — a usage limit, an API or tracker outage, a setup error,
  a person's restart. Never charged: the swarm pauses (``decide``'s pause rules)
  or simply tries again when the cause is gone; no attempt, no hold.
* the issue's **own** — a worker that died, a merge that failed in a way a retry
  may fix, a tracker write refused for a passing reason. Charged: retried after
  :meth:`RetryPolicy.delay`, and put before a person at :attr:`RetryPolicy.max_attempts`.
* **permanent** — a merge jj will never make, a write the tracker will never take.
  To a person at once, with the cause and the fix; retrying would only hide it.

Like Temporal's ``RetryPolicy``, one value type times every retry: :func:`retry_policy`
(from the project's ``timing``) spawns, merges, write-backs and hooks alike; the same
type, with its own numbers, an API outage's probes (``core.agent_faults``), a tracker
client's backoff (``adapters.tracker.linear.client``) and the cluster mailbox carrier's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from ralph_dev.core.actions import Action, Hold, Merge, Restart, Spawn, VerifyMerge
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.model import WorkerRecord

_MAX_EXPONENT = 60
"""Backoff exponent clamp: a corrupt failure count must not overflow a float."""


class Blame(StrEnum):
    OUTSIDE = "outside"
    OWN = "own"
    PERMANENT = "permanent"


@dataclass(frozen=True)
class RetryPolicy:
    """How long to wait before the next try, and how many tries an issue gets."""

    initial: float
    """Seconds before the second try."""
    backoff: float = 2.0
    cap: float = 1800.0
    """No wait is longer than this."""
    max_attempts: int = 3
    """Tries of one thing (a worker, a merge) before a person is asked."""
    jitter: float = 0.0
    """Up to this fraction of each wait is taken off at random (0.5: somewhere between
    half of it and all of it), so clients that failed together do not retry together.
    0: every wait is exact. The random draw is the caller's (:meth:`delay`'s ``draw``):
    this value reads no random source."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"RetryPolicy.jitter must be within 0..1, not {self.jitter!r}")

    def delay(self, failures: int, *, draw: float = 1.0) -> float:
        """Seconds to wait after ``failures`` failures in a row: 0 before any, then
        ``initial``, multiplied by ``backoff`` with each next failure, never over ``cap``.

        ``draw``: a uniform random number in [0, 1) the caller took (``random.random()``),
        used only with ``jitter``: the wait is ``(1 - jitter + jitter * draw)`` of the
        unjittered one. Its default 1.0 gives the longest wait (as if no jitter)."""
        if failures < 1:
            return 0.0
        exponent = min(failures - 1, _MAX_EXPONENT)
        wait = float(min(self.cap, self.initial * self.backoff ** exponent))
        if self.jitter:
            wait *= 1.0 - self.jitter + self.jitter * min(max(draw, 0.0), 1.0)
        return wait

    def due(self, failures: int, failed_at: datetime | None, now: datetime) -> bool:
        """Whether the next try may go now (after the longest wait, if jittered)."""
        if failures < 1 or failed_at is None:
            return True
        return now >= _aware(failed_at) + timedelta(seconds=self.delay(failures))

    def exhausted(self, tries: int) -> bool:
        return tries >= self.max_attempts


def retry_policy(settings: ProjectSettings) -> RetryPolicy:
    """The project's one retry policy (``timing.retry_base``, ``retry_cap``,
    ``max_attempts``)."""
    t = settings.timing
    return RetryPolicy(initial=t.retry_base, cap=t.retry_cap, max_attempts=t.max_attempts)


def blame(*, retryable: bool, outside: bool) -> Blame:
    """The one switch (controller-runtime's requeue-or-terminal): a cause outside the
    issue is never charged; otherwise a failure retrying may fix is the issue's own,
    and one it never will goes to a person."""
    if outside:
        return Blame.OUTSIDE
    return Blame.OWN if retryable else Blame.PERMANENT


HOOK_LOST = "the after_create hook cannot run"
"""A record's ``lost`` when its spawn failed on a hook that cannot run (not its fault)."""


def hold_comment(ident: str, cause: str, feedback_label: str) -> str:
    """Every hold says the same way what happened and how a person lets ralph-dev go on."""
    return (f"ralph-dev stopped working on {ident}: {cause}\n\nWhen it is fixed (or to try "
            f"again), add a comment and the label {feedback_label!r}; ralph-dev then goes on.")


@dataclass(frozen=True)
class Failure:
    """One action that failed, as the actuator saw it."""

    action: Action
    error: str
    retryable: bool
    """What the error itself says: may the same thing succeed later?"""
    tracker: bool = False
    """The tracker failed (an outage or a refusal): never the issue's fault."""
    setup: bool = False
    """ralph-dev's own setup failed (a workspace hook that cannot run)."""
    outside: bool = False
    """Something outside the issue failed (the cluster could not place its worker)."""


@dataclass(frozen=True)
class Verdict:
    blame: Blame
    record: dict[str, Any]
    """Worker-record fields to set: the facts the next tick's ``decide`` acts on."""
    stop_starts: bool = False
    """Start no other worker in this plan: every start would fail the same way."""


def verdict(failure: Failure, record: WorkerRecord | None, settings: ProjectSettings,
            now: datetime) -> Verdict:
    """Where one failed action ends. The verdict only records facts; ``decide`` acts on
    them at the next tick (a backoff, a pause, a hold), so each rule has one home."""
    action, error = failure.action, failure.error[:500]
    if failure.tracker:
        return Verdict(Blame.OUTSIDE, {})  # retried when the tracker answers; nothing charged
    if isinstance(action, Spawn | Restart):
        if failure.setup and not failure.retryable:
            return Verdict(Blame.OUTSIDE, {"lost": HOOK_LOST, "lost_at": now,
                                           "last_failure": error}, stop_starts=True)
        if failure.outside:  # tried again when decide sees room: nothing charged, and
            # the next start says this cause (not one a half-made start left in the record)
            return Verdict(Blame.OUTSIDE, {"last_failure": error, "lost": error,
                                           "lost_at": now}, stop_starts=True)
        # a half-made start is a failed attempt: backed off before the next
        return Verdict(Blame.OWN, {"last_failure_at": now, "last_failure": error, "lost": None})
    if isinstance(action, Merge | VerifyMerge):
        if failure.outside:  # its done work never came back: a new attempt does it again
            return Verdict(Blame.OUTSIDE, {"done": False, "lost": error, "lost_at": now})
        feedback = settings.labels.user_feedback_given
        if not failure.retryable:
            return Verdict(Blame.PERMANENT, {"hold_reason": hold_comment(action.issue, error,
                                                                        feedback)})
        count = (record.merge_failures if record is not None else 0) + 1
        changes: dict[str, Any] = {"merge_failures": count, "merge_failed_at": now,
                                   "last_failure": error}
        if retry_policy(settings).exhausted(count):
            changes["hold_reason"] = hold_comment(
                action.issue, f"its merge failed {count} times, each retried after a wait; "
                              f"the last error: {error}", feedback)
        return Verdict(Blame.OWN, changes)
    if isinstance(action, Hold):
        return Verdict(Blame.OUTSIDE, {"hold_reason": action.comment})  # said next tick
    return Verdict(blame(retryable=failure.retryable, outside=False), {})


def _aware(dt: datetime) -> datetime:
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt
