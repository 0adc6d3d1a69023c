"""The controller's end of the worker mailbox, for tests that play the controller by hand."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from datetime import datetime
from typing import Any, TypeVar

from ralph_dev.adapters.mailbox_server import MailboxServer
from ralph_dev.adapters.store import StateStore, utcnow
from ralph_dev.adapters.writebacks import WriteBackQueue
from ralph_dev.control.loop.act import WriteBackWriter
from ralph_dev.control.loop.intake import Intake
from ralph_dev.control.loop.worker_dirs import WorkerDirs
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.decide.swarm import write_backs
from ralph_dev.core.ports import Tracker, Workspaces

T = TypeVar("T")


class ControllerEnd:
    """The controller's real pieces that face workers — their directories, the mailbox's
    listeners, report acceptance and the write-backs — on an event loop of its own (a
    thread), as the controller process runs them."""

    def __init__(self, settings: ProjectSettings, *, store: StateStore, tracker: Tracker,
                 jj: Workspaces) -> None:
        self.settings = settings
        self.writebacks = WriteBackQueue(settings.paths.relay_dir)
        self.dirs = WorkerDirs(settings, store=store, jj=jj)
        self.intake = Intake(settings, store=store, dirs=self.dirs, writebacks=self.writebacks,
                             jj=jj, tracker=tracker)
        self.server = MailboxServer(self.dirs.run_dir, self.intake.hear)
        self.writer = WriteBackWriter(settings, tracker=tracker, store=store,
                                      writebacks=self.writebacks, clock=utcnow)
        self.intake.write_now = self.write_now
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    async def write_now(self, report: str) -> str | None:
        item = self.writebacks.get(report)
        if item is None:
            return None
        for action in write_backs((item.owed(),), True, self.settings, utcnow()):
            if (error := await self.writer.write_back(action.report)) is not None:
                return str(error)
        return None

    async def write_back_due(self, *, tracker_ok: bool = True,
                             config_loaded_at: datetime | None = None) -> list[str]:
        """What a tick does with the queue: every write-back ``decide`` finds due, made;
        the errors of those that failed."""
        owed = [item.owed() for item in self.writebacks.items()]
        errors = []
        for action in write_backs(owed, tracker_ok, self.settings, utcnow(),
                                  config_loaded_at=config_loaded_at):
            if (error := await self.writer.write_back(action.report)) is not None:
                errors.append(str(error))
        return errors

    def listen(self) -> None:
        self.call(self.server.listen(self.dirs.names()))

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def close(self) -> None:
        self.call(self.server.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
