"""Observe: everything one tick's ``decide`` needs, read now.

One tmux call, one jj call, the tracker's issue list and ralph-dev's own records; a
renumbered issue keeps the name its worker started with. Shared by the controller
and ``ralph-dev plan`` (which observes but never acts).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import structlog

from ralph_dev.adapters.store import StateStore
from ralph_dev.core.errors import TrackerError
from ralph_dev.core.model import Issue, Observed, Window, WorkerRecord
from ralph_dev.core.ports import TrackerReader, WindowLister, WorkspaceLister
from ralph_dev.core.renumber import keep_local_names, local_aliases

log = structlog.get_logger(__name__)


def _mtime(path: Path) -> datetime | None:
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, UTC)
    except (OSError, ValueError):
        return None


def _pane_log(store: StateStore, window: Window) -> Path | None:
    try:
        return store.log_path(window.name)
    except ValueError:
        return None  # not a worker's window: no log of its own


def output_marks(windows: Sequence[Window], store: StateStore,
                 records: Mapping[str, WorkerRecord], *, agent_aware: bool) -> tuple[Window, ...]:
    """Stamp each window with when its worker last did something.

    For Claude Code (``agent_aware``) that is the agent's own account: its hooks
    (``last_activity``) and its transcript's growth. Its pane is no witness: the
    spinner keeps printing while a model call hangs. For the ``command`` runner it
    is the pane: the pipe-pane log's mtime changes exactly when the pane prints.
    Either way no per-window tmux call is needed (the tick stays at one).
    """
    marked = []
    for window in windows:
        record = records.get(window.name)
        if agent_aware and record is not None:
            stamps = [t for t in (record.last_activity, record.started_at,
                                  _mtime(Path(record.transcript)) if record.transcript else None)
                      if t is not None]
            changed = max(stamps) if stamps else None
        else:
            log_file = _pane_log(store, window)
            changed = _mtime(log_file) if log_file is not None else None
        marked.append(window if changed is None
                      else dataclasses.replace(window, output_changed_at=changed))
    return tuple(marked)


async def observe(tracker: TrackerReader, tmux: WindowLister, jj: WorkspaceLister,
                  store: StateStore, *, agent_aware: bool = False,
                  relaying: frozenset[str] = frozenset()
                  ) -> tuple[Observed, TrackerError | None]:
    """Everything decide needs, read now; and the tracker's error when it could not be read.

    Shared by the controller and ``ralph-dev plan`` (which observes but never acts).
    """
    tracker_error: TrackerError | None = None
    issues: tuple[Issue, ...] = ()
    try:
        issues = tuple(await tracker.list_issues())
    except TrackerError as exc:
        tracker_error = exc
        log.warning("tracker_unavailable", error=str(exc))
    windows = await asyncio.to_thread(tmux.list_windows)
    workspaces = await asyncio.to_thread(jj.list_workspaces)
    records = store.load_records()
    local = {*records, *(w.name for w in windows), *(w.name for w in workspaces)}
    renamed = tracker.renamed()
    if aliases := local_aliases(renamed, local):
        log.info("issues_renumbered", kept_as=aliases)  # its one worker keeps its name
    issues = keep_local_names(issues, renamed, local)
    observed = Observed(
        issues=issues,
        windows=output_marks(windows, store, records, agent_aware=agent_aware),
        workspaces=tuple(workspaces),
        records=records,
        tracker_ok=tracker_error is None,
        trunk_red=store.paths.trunk_red_file.exists(),
        pauses=store.load_pauses(),
        relaying=relaying,
    )
    return observed, tracker_error
