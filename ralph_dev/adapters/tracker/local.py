"""The embedded tracker: one SQLite file per project, holding what Linear holds for us.

``LocalTracker`` is a reader, a writer and an issue creator over one
``TrackerDb`` (local_db.py: connections, transactions, identifiers), each in
its own module; this class only hands each call of the port to the part that
makes it, in a thread (``asyncio.to_thread``) so a writer waiting on another
process's lock never blocks the event loop. The ``*_sync`` twins are for the
CLI and tests.

Identifiers are ``KEY-N`` with N from a counter in the ``meta`` table, so a
number is never handed out twice even if issues ever get deleted. Text from
issues is stored and returned as data; only identifiers (checked against
``IDENTIFIER_RE`` and this tracker's key) are used to look things up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from ralph_dev.adapters.tracker.local_create import LocalIssueCreator
from ralph_dev.adapters.tracker.local_db import TrackerDb
from ralph_dev.adapters.tracker.local_read import LocalReader
from ralph_dev.adapters.tracker.local_write import LocalWriter
from ralph_dev.core.model import Issue, NewIssue, StateType


class LocalTracker:
    """The SQLite tracker of one project; implements ``core.ports.Tracker``."""

    def __init__(self, db_path: Path, key: str) -> None:
        self.db = TrackerDb(db_path, key)
        self.reader = LocalReader(self.db)
        self.writer = LocalWriter(self.db, self.reader)
        self.creator = LocalIssueCreator(self.db)

    @property
    def db_path(self) -> Path:
        return self.db.db_path

    @property
    def key(self) -> str:
        return self.db.key

    def __repr__(self) -> str:
        return f"LocalTracker({str(self.db_path)!r}, key={self.key!r})"

    # --- synchronous twins (the CLI and tests) -------------------------------------

    def list_issues_sync(self) -> list[Issue]:
        return self.reader.list_issues()

    def get_sync(self, identifier: str) -> Issue:
        return self.reader.get(identifier)

    def set_state_sync(self, identifier: str, *, name: str | None = None,
                       type: StateType | None = None) -> Issue:
        return self.writer.set_state(identifier, name=name, type=type)

    def change_labels_sync(self, identifier: str, *, add: Sequence[str] = (),
                           remove: Sequence[str] = ()) -> Issue:
        return self.writer.change_labels(identifier, add=add, remove=remove)

    def comment_sync(self, identifier: str, body: str, *, by_ralph: bool = True,
                     author: str | None = None) -> None:
        self.writer.comment(identifier, body, by_ralph=by_ralph, author=author)

    def create_issues_sync(self, new: Sequence[NewIssue]) -> list[str]:
        return self.creator.create_issues(new)

    # --- the async port ------------------------------------------------------------

    async def list_issues(self) -> list[Issue]:
        return await asyncio.to_thread(self.reader.list_issues)

    async def get(self, identifier: str) -> Issue:
        return await asyncio.to_thread(self.reader.get, identifier)

    async def set_state(self, identifier: str, *, name: str | None = None,
                        type: StateType | None = None) -> Issue:
        return await asyncio.to_thread(self.writer.set_state, identifier, name=name, type=type)

    async def change_labels(self, identifier: str, *, add: Sequence[str] = (),
                            remove: Sequence[str] = ()) -> Issue:
        return await asyncio.to_thread(self.writer.change_labels, identifier, add=list(add),
                                       remove=list(remove))

    async def add_labels(self, identifier: str, labels: Sequence[str]) -> Issue:
        return await self.change_labels(identifier, add=labels)

    async def remove_labels(self, identifier: str, labels: Sequence[str]) -> Issue:
        return await self.change_labels(identifier, remove=labels)

    async def set_priority(self, identifier: str, priority: int) -> Issue:
        return await asyncio.to_thread(self.writer.set_priority, identifier, priority)

    async def comment(self, identifier: str, body: str, *, by_ralph: bool = True,
                      author: str | None = None) -> None:
        await asyncio.to_thread(self.writer.comment, identifier, body, by_ralph=by_ralph,
                                author=author)

    async def create_issues(self, new: Sequence[NewIssue]) -> list[str]:
        return await asyncio.to_thread(self.creator.create_issues, list(new))

    async def add_blocker(self, identifier: str, blocker: str) -> Issue:
        return await asyncio.to_thread(self.writer.add_blocker, identifier, blocker)

    async def remove_blocker(self, identifier: str, blocker: str) -> Issue:
        return await asyncio.to_thread(self.writer.remove_blocker, identifier, blocker)

    async def close(self) -> None:
        """Every call opens and closes its own connection; the one kept to see whether
        the database changed is closed here."""
        self.db.close()

    def renamed(self) -> dict[str, str]:
        """Local issues are never renumbered."""
        return {}

    def usage(self) -> None:
        """A local file has no request budget."""

    def expect_changes(self) -> None:
        """Every read is fresh already: nothing to do."""
