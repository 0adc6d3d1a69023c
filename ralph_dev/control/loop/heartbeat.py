"""Run a slow step off the event loop while the controller keeps beating.

The daemon takes a heartbeat older than ``timing.heartbeat_stale`` for a dead
controller; a verify command or a workspace hook may well run longer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

BEAT_EVERY = 30.0
"""Seconds between heartbeats while the step runs."""
BEAT_AFTER = 1.0
"""Seconds a step runs before its first heartbeat: the action's own (written as it
starts) stands for a quick one, and a spawn's few steps write nothing more."""


async def while_beating(beat: Callable[[str], None], acting: str,
                        func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``func(*args, **kwargs)`` in a thread, calling ``beat(acting)`` until it ends."""
    work = asyncio.ensure_future(asyncio.to_thread(func, *args, **kwargs))
    await asyncio.wait([work], timeout=BEAT_AFTER)
    while not work.done():
        beat(acting)
        await asyncio.wait([work], timeout=BEAT_EVERY)
    return work.result()
