"""A pane program that runs the agent as its child, not by exec: what it shares.

The supervisors of Codex and Gemini CLI (``inpane.event_stream``) and the sandbox's
bridge to its egress proxy (``inpane.netbridge``) keep running beside the agent, so
the pane's signals (tmux's SIGHUP, ralph-dev's SIGTERM, a person's Ctrl-C) must reach
the agent through them. Standard library only: the bridge runs inside the sandbox.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

PANE_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def start_child(argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any] | None:
    """Start ``argv`` with the pane's signals passed on to it; None (having said why on
    stderr) when it cannot be run."""
    try:
        child = subprocess.Popen(list(argv), **popen)
    except OSError as exc:
        print(f"ralph-dev: cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
        return None

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    for signum in PANE_SIGNALS:
        signal.signal(signum, forward)
    return child
