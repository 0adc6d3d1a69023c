"""The tracker Protocol: what the controller and the CLI need from an issue tracker.

The local SQLite tracker and the Linear client both implement it, so the
controller never knows which one it talks to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ralph_dev.core.errors import RalphError
from ralph_dev.core.model import Issue, NewIssue, StateType


class TrackerError(RalphError):
    """Any tracker failure. ``retryable`` says whether the next tick may succeed."""

    retryable: bool = True


class TrackerUnavailable(TrackerError):
    """The tracker could not be reached or answered garbage; try again later."""


class TrackerInputError(TrackerError):
    """The request itself is wrong (unknown issue, bad state, cycle…); do not retry."""

    retryable = False


class UnknownIssue(TrackerInputError):
    pass


@runtime_checkable
class Tracker(Protocol):
    async def list_issues(self) -> list[Issue]:
        """Every issue of the project, with blockers, parent/children, labels, comments;
        then any blocker or sub-issue that lives outside the project (another Linear
        project), marked ``foreign``: there only so its state counts, never acted on."""

    async def refresh(self, identifiers: Sequence[str]) -> list[Issue]:
        """Re-read just these issues (unknown ones are left out)."""

    async def get(self, identifier: str) -> Issue:
        """One issue; raises ``UnknownIssue``."""

    async def set_state(
        self, identifier: str, *, name: str | None = None, type: StateType | None = None
    ) -> Issue:
        """Move an issue to the state called ``name``, or the first state of ``type``."""

    async def add_labels(self, identifier: str, labels: Sequence[str]) -> Issue:
        """Add labels incrementally (never replacing the whole set)."""

    async def remove_labels(self, identifier: str, labels: Sequence[str]) -> Issue:
        """Remove labels incrementally; absent ones are ignored."""

    async def comment(self, identifier: str, body: str, *, by_ralph: bool = True) -> None:
        """Add a comment. ``by_ralph`` marks ralph-dev's own words (never human feedback)."""

    async def create_issues(self, new: Sequence[NewIssue]) -> list[str]:
        """Create issues (with parents and blockers, possibly among themselves),
        all or nothing where the tracker allows it; return their identifiers in order."""

    async def close(self) -> None:
        """Release connections."""
