"""The base of every error a person can act on.

The CLI turns any ``RalphError`` into its message on stderr and a non-zero
exit code, with no traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class RalphError(Exception):
    """An error whose message names the problem and the fix."""

    exit_code = 1
    retryable = False
