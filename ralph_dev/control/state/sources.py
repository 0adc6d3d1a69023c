"""Where the state document's facts come from, read cheaply and cached briefly.

The daemon rebuilds the document every few seconds while a dashboard watches;
the tracker answer and trunk's recent changes are reused for a while
(``issues_ttl``, ``trunk_ttl``) so watching never spends the controller's
tracker budget.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from ralph_dev.adapters.store import StateStore
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import RalphError, TrackerError
from ralph_dev.core.model import Issue

MERGES_SHOWN = 10
"""Trunk changes the state document lists."""


class StateSources:
    """Where the document's facts come from, with the caching a long-lived reader needs.

    ``issues_ttl`` and ``trunk_ttl`` (seconds) let the daemon serve a dashboard that
    refreshes every few seconds from one tracker read and one jj call per period;
    the one-shot ``status`` command uses 0 (always fresh).
    """

    def __init__(self, settings: ProjectSettings, *, tmux: Any = None, jj: Any = None,
                 issues_ttl: float = 0.0, trunk_ttl: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from ralph_dev.control.loop.wiring import jj_for, tmux_for

        self.settings = settings
        self.store = StateStore(settings.paths)
        self.tmux = tmux or tmux_for(settings)
        self.jj = jj or jj_for(settings)
        self.issues_ttl = issues_ttl
        self.trunk_ttl = trunk_ttl
        self.clock = clock
        self._tracker: Any = None
        self._issues: tuple[float, list[Issue] | None, str | None] | None = None
        self._trunk: tuple[float, list[Any] | None, str | None] | None = None
        self._lock = asyncio.Lock()

    def _fresh(self, cached: tuple[float, Any, Any] | None, ttl: float) -> bool:
        return cached is not None and self.clock() - cached[0] < ttl

    async def issues(self) -> tuple[list[Issue] | None, str | None]:
        """Every issue (or None) and the tracker's error (or None)."""
        async with self._lock:
            if not self._fresh(self._issues, self.issues_ttl):
                if self._tracker is None:
                    from ralph_dev.adapters.tracker import open_tracker

                    self._tracker = open_tracker(self.settings)
                try:
                    found: list[Issue] | None = list(await self._tracker.list_issues())
                    error = None
                except TrackerError as exc:
                    found, error = None, str(exc)
                self._issues = (self.clock(), found, error)
            assert self._issues is not None
            return self._issues[1], self._issues[2]

    async def tracker(self) -> Any:
        """The open tracker (for reading one issue, e.g. a held one's question)."""
        if self._tracker is None:
            await self.issues()
        return self._tracker

    async def trunk_changes(self) -> tuple[list[Any] | None, str | None]:
        """Trunk's newest changes (newest first) or the reason they could not be read."""
        if not self._fresh(self._trunk, self.trunk_ttl):
            try:
                changes = await asyncio.to_thread(self.jj.trunk.trunk_changes, MERGES_SHOWN)
                self._trunk = (self.clock(), changes, None)
            except (RalphError, OSError) as exc:
                self._trunk = (self.clock(), None, str(exc)[:300])
        assert self._trunk is not None
        return self._trunk[1], self._trunk[2]

    def forget_trunk(self) -> None:
        """Trunk moved (a merge event): read it again next time."""
        self._trunk = None

    async def close(self) -> None:
        if self._tracker is not None:
            await self._tracker.close()
            self._tracker = None
