"""The controller's end of the worker channel, for tests that play the controller by hand."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from ralph_dev.control.channel import Channel

T = TypeVar("T")


class ControllerEnd:
    """The controller's end of the channel on an event loop of its own (a thread), as the
    controller process runs it: listening on every worker's socket."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def close(self) -> None:
        self.call(self.channel.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
