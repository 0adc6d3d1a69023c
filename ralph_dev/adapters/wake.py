"""How any ralph-dev process asks the running controller to tick now.

The controller's heartbeat names its pid; a wake-up is SIGUSR1 to that pid.
Both sides live here so the protocol is in one place: ``poke`` (called by a
person's tracker write; workers tell the controller through their own socket,
``adapters.mailbox``) and ``install`` (called by the
controller's run loop). Best effort: a missing or stale controller just means
the next poll picks the change up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

from ralph_dev.adapters.store import StateStore

WAKE_SIGNAL = signal.SIGUSR1


def poke(store: StateStore) -> bool:
    """Signal the project's controller (pid from its heartbeat); True when sent."""
    beat = store.read_heartbeat()
    return poke_pid(beat.get("pid") if beat else None)


def poke_pid(pid: object) -> bool:
    """Signal the controller ``pid`` (as its heartbeat names it); True when sent."""
    if not isinstance(pid, int) or pid <= 1:
        return False
    # SIGUSR1 ends a process that does not handle it: make sure the pid (from a file
    # that may be stale) is still a ralph-dev controller before sending it.
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if b"ralph_dev" not in cmdline or b"controller" not in cmdline:
        return False
    try:
        os.kill(pid, WAKE_SIGNAL)
    except OSError:
        return False
    return True


def install(loop: asyncio.AbstractEventLoop, wake: asyncio.Event) -> None:
    """Make a poke set ``wake`` (the controller's loop waits on it between polls)."""
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(WAKE_SIGNAL, wake.set)
