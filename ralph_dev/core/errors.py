"""The errors a person (or the controller's failure policy) can act on.

The CLI turns any ``RalphError`` into its message on stderr and a non-zero
exit code, with no traceback; anything else is a bug and keeps its traceback.
``retryable`` says whether trying the same thing again later may succeed: the
controller reads it to tell a passing failure from one a person must fix.
"""

from __future__ import annotations

from collections.abc import Sequence


class RalphError(Exception):
    """An error whose message names the problem and the fix."""

    exit_code = 1
    retryable = False


class CommandError(RalphError):
    """An outside command (jj, tmux, gh, systemctl…) failed; carries the command (secrets
    redacted), what it said on stderr and its exit code, for the log and the fix."""

    def __init__(self, message: str, *, command: Sequence[str] = (), stderr: str = "",
                 returncode: int | None = None) -> None:
        super().__init__(message)
        self.command = list(command)
        self.stderr = stderr
        self.returncode = returncode


class ConfigError(RalphError):
    """A setting is missing or wrong; the message says where and how to fix it."""


class UnknownProject(ConfigError):
    pass


class TrackerError(RalphError):
    """Any tracker failure. ``retryable`` says whether the next tick may succeed."""

    retryable = True


class TrackerUnavailable(TrackerError):
    """The tracker could not be reached or answered garbage; try again later."""


class TrackerInputError(TrackerError):
    """The request itself is wrong (unknown issue, bad state, cycle…); do not retry."""

    retryable = False


class UnknownIssue(TrackerInputError):
    pass


class WorkspaceHookFailed(RalphError):
    """A project's workspace hook (``after_create``) failed: the spawn failed and its
    workspace is gone again. ``retryable`` is False when only a person can fix it (the
    command is missing, or writes files jj would merge), True when a later try may pass
    (a non-zero exit or a timeout: a registry or network hiccup)."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class HostUnavailable(RalphError):
    """The cluster cannot place or reach a worker now (no free slot, a node lost, the
    cluster away): a cause outside the issue, so no attempt is charged for it."""

    retryable = True


class LaneStale(RalphError):
    """A verified batch could not land as verified (trunk moved, a change under it
    changed): the merge lane verifies again. Nobody's failure: nothing is charged."""

    retryable = True
