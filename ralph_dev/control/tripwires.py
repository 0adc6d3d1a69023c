"""A second line behind the sandbox: files no worker may change, watched by the controller.

The sandbox keeps ralph-dev's config hidden and the main repository's working copy
read-only for workers (``agent.sandbox``). If either changes anyway while workers run,
the controller says so (a ``tripwire`` event naming the files). When workers run
unconfined (``agent.sandbox = "off"``) one of them may have done it, and nothing tells
which: every issue whose worker was live is held for a person, with the files in the
comment. Under the sandbox no worker can write there, so the change was a person's:
the event only. A changed config also says that the running controller still uses
the config it started with.

What a worker writes into another worker's workspace is not detected here: under the
sandbox other workspaces are hidden; unconfined, it would show in that issue's merge.
Checked at most every ``CHECK_EVERY`` seconds: a walk of file metadata, no reads.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import structlog

from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.model import Observed
from ralph_dev.core.state import StateStore

log = structlog.get_logger(__name__)

CHECK_EVERY = timedelta(seconds=30)
SKIPPED = frozenset({".git", ".jj"})
"""Version control's own directories: jj and git write there for ralph-dev's merges."""

Stamp = tuple[int, int]


def _walk(root: Path, skip: Path | None) -> Iterator[tuple[str, Stamp]]:
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            path = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                if entry.name not in SKIPPED and path != skip:
                    stack.append(path)
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            yield str(path.relative_to(root)), (info.st_size, info.st_mtime_ns)


def fingerprint(settings: ProjectSettings, config: Path) -> dict[str, Stamp]:
    """Size and mtime of the config file and of every file in the main working copy
    (the workspace root left out when it lies inside)."""
    skip = settings.workspaces.resolve()
    found = {f"repo:{name}": stamp for name, stamp in _walk(settings.repo.resolve(), skip)}
    try:
        info = config.stat()
        found["config"] = (info.st_size, info.st_mtime_ns)
    except OSError:
        found["config"] = (-1, 0)
    return found


def changed(before: dict[str, Stamp], after: dict[str, Stamp]) -> list[str]:
    return sorted(name for name in before.keys() | after.keys()
                  if before.get(name) != after.get(name))


class Tripwires:
    def __init__(self, settings: ProjectSettings, store: StateStore, *, config: Path,
                 clock: Callable[[], datetime]) -> None:
        self.settings = settings
        self.store = store
        self.config = config
        self.clock = clock
        self.last: dict[str, Stamp] | None = None
        self.checked_at: datetime | None = None

    def check(self, observed: Observed) -> tuple[list[str], str]:
        """(issues to hold, why) when watched files changed since the last check."""
        now = self.clock()
        if self.checked_at is not None and now - self.checked_at < CHECK_EVERY:
            return [], ""
        self.checked_at = now
        current = fingerprint(self.settings, self.config)
        before, self.last = self.last, current
        if before is None:
            return [], ""
        files = changed(before, current)
        if not files:
            return [], ""
        live = sorted({w.name for w in observed.windows if w.alive and w.name in observed.records})
        unconfined = self.settings.agent.sandbox == "off"
        shown = [f.removeprefix("repo:") if f != "config" else str(self.config) for f in files]
        self.store.append_event("tripwire", files=shown[:20], live_workers=live,
                                held=live if unconfined else [])
        log.warning("tripwire", files=shown[:20], live_workers=live)
        if not unconfined or not live:
            return [], ""
        where = ", ".join(shown[:10]) + (" …" if len(shown) > 10 else "")
        why = (f"files no worker may change were changed while workers ran unconfined "
               f"(agent.sandbox = \"off\"): {where}. Look at them (the main working copy "
               f"in {self.settings.repo}, ralph-dev's config); if a worker did it, its "
               "issue text may have told it to")
        return live, why
