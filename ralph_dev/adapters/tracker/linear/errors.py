"""What can go wrong with Linear, typed: retryable (unavailable) or for a person to fix."""

from __future__ import annotations

from collections.abc import Sequence

from ralph_dev.core.errors import TrackerError, TrackerInputError, TrackerUnavailable


class LinearUnavailable(TrackerUnavailable):
    """Linear could not be reached, is rate limiting us, or answered garbage."""


class LinearAuthError(TrackerInputError):
    """Linear refused the API key; retrying will not help."""


class LinearSetupError(TrackerInputError):
    """The project, its teams, states or labels are not usable as configured."""


class LinearNotFound(TrackerInputError):
    """Linear says an entity (issue, state, label…) does not exist."""


class LinearPartialCreate(TrackerError):
    """Some issues of a batch were created before a failure (Linear has no transactions)."""

    retryable = False

    def __init__(self, message: str, created: Sequence[str]) -> None:
        super().__init__(message)
        self.created = list(created)
