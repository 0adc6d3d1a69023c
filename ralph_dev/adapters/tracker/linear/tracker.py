"""The Linear tracker: the tracker Protocol over Linear's GraphQL API (gql + aiohttp).

Composed of small parts over one ``LinearContext`` (the client, the project's
``ProjectDirectory`` of teams, states and labels, and the issue cache):
``LinearReader`` (reading.py), ``LinearWriter`` (writing.py) and
``LinearIssueCreator`` (creating.py); this class only hands each call of the
port to the part that makes it. Every document they send lives in
``graphql/*.graphql`` (named operations only) and a test validates each one
against Linear's published schema, so a typo fails in CI, not at 3 a.m.

Reading. A full sync (every issue of the project, in pages that stay under
5,000 complexity points, then the rest of any connection a page cut short, then
the state of blockers and sub-issues outside the project) runs at start and
every ``full_sync_interval``; it is saved to a disk cache that short-lived
processes start from. In between, ``list_issues`` polls at most every
``poll_interval`` seconds (controller ticks in between read the cache; a write
by another ralph-dev process of the project forces the next poll), and a poll
is ONE request: which issues changed (id and updatedAt, over an overlapping
window), the few changed after everything held in full, new comments with their
text, and the newest relation changes of the workspace. Only what is new beyond
that is then fetched (one more request). ``get`` in a process that keeps this
view (the controller) answers from it, so a write-back costs only its writes.
See ``benchmarks/linear_budget.py`` for what this costs.

Writing. New issues go to the team's first "unstarted" state (Todo), or
``tracker.linear_new_state``, in the parent's team, else ``tracker.linear_team``,
else the project's only team. Labels change incrementally.

Failures are the client's business (``client.py``): typed errors, backoff
shared by every process of the project, never a secret in a message.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from ralph_dev.adapters.tracker.linear.apikey import load_api_key
from ralph_dev.adapters.tracker.linear.cache import CACHE_FILE, RATE_FILE
from ralph_dev.adapters.tracker.linear.client import DEFAULT_URL, URL_ENV, LinearClient
from ralph_dev.adapters.tracker.linear.context import LinearContext
from ralph_dev.adapters.tracker.linear.creating import LinearIssueCreator
from ralph_dev.adapters.tracker.linear.reading import PAGE_SIZE, LinearReader
from ralph_dev.adapters.tracker.linear.writing import LinearWriter
from ralph_dev.core.model import Issue, NewIssue, StateType

if TYPE_CHECKING:
    from ralph_dev.core.config import ProjectSettings


class LinearTracker:
    """The issues of one Linear project, behind ``core.ports.Tracker``: a reader, a
    writer and an issue creator over one shared context (client, project, cache)."""

    def __init__(self, client: LinearClient, project: str, *,
                 full_sync_interval: float = 1800.0, poll_interval: float = 30.0,
                 page_size: int = PAGE_SIZE, default_team: str | None = None,
                 new_state: str | None = None, cache_file: Path | None = None) -> None:
        self.client = client
        self.context = LinearContext(client, project, full_sync_interval=full_sync_interval,
                                     default_team=default_team, new_state=new_state,
                                     cache_file=cache_file)
        self.directory = self.context.directory
        self.reader = LinearReader(self.context, poll_interval=poll_interval,
                                   page_size=page_size)
        self.writer = LinearWriter(self.reader)
        self.creator = LinearIssueCreator(self.reader)

    @classmethod
    def from_settings(cls, settings: ProjectSettings, *, shared: bool = True,
                      **client_args: Any) -> Self:
        """``shared=False`` keeps no files (``init``, before the project exists)."""
        key = load_api_key(settings.tracker)
        url = os.environ.get(URL_ENV) or DEFAULT_URL
        state_dir = settings.paths.state_dir
        if shared:
            client_args.setdefault("shared_state", state_dir / RATE_FILE)
        client = LinearClient(key, url, **client_args)
        t = settings.tracker
        return cls(client, t.linear_project or "", full_sync_interval=t.full_sync_interval,
                   poll_interval=t.linear_poll_interval, default_team=t.linear_team,
                   new_state=t.linear_new_state,
                   cache_file=state_dir / CACHE_FILE if shared else None)

    def __repr__(self) -> str:
        return f"LinearTracker({self.directory.project_ref!r}, {self.client!r})"

    # --- TrackerReader ---------------------------------------------------------------

    async def list_issues(self) -> list[Issue]:
        return await self.reader.list_issues()

    async def get(self, identifier: str) -> Issue:
        return await self.reader.get(identifier)

    def renamed(self) -> dict[str, str]:
        return self.reader.renamed()

    def usage(self) -> dict[str, Any]:
        return self.reader.usage()

    def expect_changes(self) -> None:
        self.reader.expect_changes()

    async def close(self) -> None:
        await self.context.close()

    # --- TrackerWriter and Blockers -----------------------------------------------------

    async def set_state(self, identifier: str, *, name: str | None = None,
                        type: StateType | None = None) -> Issue:
        return await self.writer.set_state(identifier, name=name, type=type)

    async def change_labels(self, identifier: str, *, add: Sequence[str] = (),
                            remove: Sequence[str] = ()) -> Issue:
        return await self.writer.change_labels(identifier, add=add, remove=remove)

    async def add_labels(self, identifier: str, labels: Sequence[str]) -> Issue:
        return await self.writer.change_labels(identifier, add=labels)

    async def remove_labels(self, identifier: str, labels: Sequence[str]) -> Issue:
        return await self.writer.change_labels(identifier, remove=labels)

    async def set_priority(self, identifier: str, priority: int) -> Issue:
        return await self.writer.set_priority(identifier, priority)

    async def comment(self, identifier: str, body: str, *, by_ralph: bool = True,
                      author: str | None = None) -> None:
        await self.writer.comment(identifier, body, by_ralph=by_ralph, author=author)

    async def add_blocker(self, identifier: str, blocker: str) -> Issue:
        return await self.writer.add_blocker(identifier, blocker)

    async def remove_blocker(self, identifier: str, blocker: str) -> Issue:
        return await self.writer.remove_blocker(identifier, blocker)

    async def create_issues(self, new: Sequence[NewIssue]) -> list[str]:
        return await self.creator.create_issues(new)
