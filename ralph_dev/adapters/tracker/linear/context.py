"""What the reader and the writer of one Linear project share.

One client (so one backoff and one request count), one ``ProjectDirectory``
(teams, states, labels) and this process's ``IssueCache``: a write stores the
issue Linear answers with, so the next read sees it without asking again. The
cache starts from the disk cache of the last full sync when that is fresh
(short-lived processes then need one poll instead of a full read), and is
saved back there by long-lived ones.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import structlog

from ralph_dev.adapters.tracker.linear.cache import (
    PROJECT_FILE,
    IssueCache,
    load_cache,
    save_json,
)
from ralph_dev.adapters.tracker.linear.client import LinearClient
from ralph_dev.adapters.tracker.linear.directory import ProjectDirectory
from ralph_dev.adapters.tracker.linear.errors import LinearSetupError
from ralph_dev.adapters.tracker.linear.parse import LinearLabel, LinearTeam
from ralph_dev.core.model import Issue

log = structlog.get_logger(__name__)

SAVE_EVERY = timedelta(seconds=60)
"""A long-lived process saves the disk cache after polls at most this often."""


class LinearContext:
    """The client, the project directory and the issue cache of one Linear project."""

    def __init__(self, client: LinearClient, project_ref: str, *,
                 full_sync_interval: float = 1800.0, default_team: str | None = None,
                 new_state: str | None = None, cache_file: Path | None = None) -> None:
        self.client = client
        self.full_sync_interval = full_sync_interval
        self.cache_file = cache_file
        self.directory = ProjectDirectory(
            client, project_ref, default_team=default_team, new_state=new_state,
            project_file=cache_file.with_name(PROJECT_FILE) if cache_file else None,
            labels_changed=self._labels_changed)
        self.cache: IssueCache | None = None
        self.dirty = False
        """The cache holds writes or poll results the disk cache does not have yet."""
        self._disk_checked = False
        self._saved_at: datetime | None = None

    @property
    def project_ref(self) -> str:
        return self.directory.project_ref

    @property
    def clock(self) -> Callable[[], datetime]:
        return self.client.clock

    def _labels_changed(self, labels: list[LinearLabel]) -> None:
        if self.cache is not None:
            self.cache.labels = {x.id: x for x in labels}

    async def open_cache(self) -> IssueCache:
        """The cache: this process's, else the disk cache of the last full sync when it is
        fresh, else an empty one that knows only what is read into it."""
        if self.cache is not None:
            return self.cache
        project = await self.directory.project()
        cache = None
        if self.cache_file is not None and not self._disk_checked:
            self._disk_checked = True
            cache = load_cache(self.cache_file, self.project_ref, project)
            if cache is not None:
                self.directory.adopt_labels(list(cache.labels.values()))
            if cache is not None and not self.fresh(cache):
                cache = None
            if cache is not None:
                log.info("linear_cache_loaded", issues=len(cache.members()),
                         synced_at=cache.synced_at.isoformat() if cache.synced_at else None)
                self._saved_at = self.clock()
        self.cache = cache or IssueCache(project)
        if self.directory.labels_known is not None:
            self.cache.labels = {x.id: x for x in self.directory.labels_known}
        return self.cache

    def fresh(self, cache: IssueCache) -> bool:
        """Started from a full sync younger than ``full_sync_interval``."""
        if cache.synced_at is None:
            return False
        age = (self.clock() - cache.synced_at).total_seconds()
        return 0 <= age < self.full_sync_interval

    def save(self, *, force: bool = False) -> None:
        cache = self.cache
        if self.cache_file is None or cache is None or cache.synced_at is None:
            return  # only a cache that started from a full sync is worth sharing
        now = self.clock()
        if not force and self._saved_at is not None and now - self._saved_at < SAVE_EVERY:
            self.dirty = True
            return
        save_json(self.cache_file, cache.to_json(self.project_ref))
        self._saved_at = now
        self.dirty = False

    async def team_of(self, issue: Issue) -> LinearTeam:
        """The project team ``issue`` belongs to (its workflow states, its labels)."""
        project = await self.directory.project()
        cache = await self.open_cache()
        entry = cache.entries.get(issue.id)
        team = project.team(entry.team_id if entry else issue.team or "")
        if team is None:
            raise LinearSetupError(
                f"{issue.identifier} belongs to team {issue.team}, which is not a team of "
                f"Linear project {project.name!r}; add the team to the project in Linear"
            )
        return team

    async def close(self) -> None:
        """Save what a poll or write added to the disk cache; every call opens and closes
        its own HTTP session, so there is nothing else to release."""
        if self.dirty:
            self.save(force=True)
