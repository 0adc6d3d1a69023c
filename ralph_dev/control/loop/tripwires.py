"""A second line behind the sandbox: files no worker may change, watched by the controller.

The sandbox keeps ralph-dev's config hidden and the main repository's working copy
read-only for workers (``agent.sandbox``). If either changes anyway while workers run,
the controller says so (a ``tripwire`` event naming the files). When workers run
unconfined (``agent.sandbox = "off"``) one of them may have done it, and nothing tells
which: every issue whose worker was live is held for a person, with the files in the
comment, and its worker stopped (its work stays in its workspace). Under the sandbox
no worker can write there, so the change was a person's: the event only. With no
worker live at this check or the last, it was a person's too: nothing is said. (A
person's config edit is read and applied by the controller too: ``control.config_watch``.)

Other workers' workspaces are watched while their issue has no live worker (done and
waiting for its merge, waiting for a slot): nothing but the controller may change them
then, and the controller says when it acts on one (``controller_acted``). A file
planted there would be merged as that issue's work, so unconfined, that issue is held
too. A held issue's workspace is in a person's hands: a change there is the event only.
A write into a workspace whose own worker is live is not told apart from that worker's
own work: under the sandbox it cannot happen (other workspaces are hidden), unconfined
it is merged with that issue's change.

Checked at most every ``timing.tripwire_interval`` seconds: a walk of file metadata.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import structlog

from ralph_dev.adapters.store import StateStore
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.model import Observed

log = structlog.get_logger(__name__)

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
        self.resting: dict[str, dict[str, Stamp]] = {}
        """Each workspace whose issue has no working worker, as it was at the last check."""
        self.acted_on: set[str] = set()
        self.live_before: set[str] = set()
        self.checked_at: datetime | None = None

    def controller_acted(self, issue: str) -> None:
        """The controller's own actions change workspaces (a merge rebases and verifies
        in one, a restart hands it to a new worker): that workspace's watch starts over."""
        self.acted_on.add(issue)

    async def check(self, observed: Observed) -> dict[str, str]:
        """Issues to hold, each with why, when watched files changed since the last check."""
        now = self.clock()
        every = timedelta(seconds=self.settings.timing.tripwire_interval)
        if self.checked_at is not None and now - self.checked_at < every:
            return {}
        self.checked_at = now
        live_now = {w.name for w in observed.windows if w.alive and w.name in observed.records}
        working_now = {name for name in live_now if not observed.records[name].done}
        shared, resting = await asyncio.to_thread(self._look, observed, working_now)
        # a worker that wrote and ended since the last check is as suspect as a live one;
        # with none either time, the change was a person's and not worth an event
        live = sorted(live_now | self.live_before)
        self.live_before = live_now
        held = self._check_shared(shared, live)
        labels = self.settings.labels
        persons = {i.identifier for i in observed.issues
                   if {labels.hold.casefold(), labels.user_input_needed.casefold()}
                   & {label.casefold() for label in i.labels}}
        for name, files in self._check_workspaces(resting).items():
            held.update(self._trip_workspace(name, files, live, persons))
        return held

    def _look(self, observed: Observed, working: set[str]
              ) -> tuple[dict[str, Stamp], dict[str, dict[str, Stamp]]]:
        """The walks: the config and main working copy, and each workspace whose issue has
        no working worker (none live, or it reported done). About 0.7 s per 100,000 files
        here, so they run in a thread: the controller keeps hearing workers meanwhile."""
        root = self.settings.workspaces.resolve()
        resting: dict[str, dict[str, Stamp]] = {}
        for workspace in observed.workspaces:
            name = workspace.name
            path = (root / name).resolve()
            if (name in observed.records and name not in working and path.parent == root
                    and path.is_dir()):
                resting[name] = dict(_walk(path, None))
        return fingerprint(self.settings, self.config), resting

    def _check_shared(self, current: dict[str, Stamp], live: list[str]) -> dict[str, str]:
        before, self.last = self.last, current
        files = changed(before, current) if before is not None else []
        if not files or not live:
            return {}
        unconfined = self.settings.agent.sandbox == "off"
        shown = [f.removeprefix("repo:") if f != "config" else str(self.config) for f in files]
        self.store.append_event("tripwire", files=shown[:20], live_workers=live,
                                held=live if unconfined else [])
        log.warning("tripwire", files=shown[:20], live_workers=live)
        if not unconfined:
            return {}
        why = (f"files no worker may change were changed while workers ran unconfined "
               f"(agent.sandbox = \"off\"): {_listed(shown)}. Nothing tells which worker "
               f"did it, so every live one was stopped (its work stays in its workspace). "
               f"Look at them (the main working copy in {self.settings.repo}, ralph-dev's "
               "config); if a worker did it, its issue text may have told it to")
        return dict.fromkeys(live, why)

    def _check_workspaces(self, resting: dict[str, dict[str, Stamp]]) -> dict[str, list[str]]:
        """What changed in each resting workspace since the last check, unless the
        controller acted on it in between (it is seen afresh now)."""
        before, self.resting = self.resting, resting
        acted_on, self.acted_on = self.acted_on, set()
        found = {name: changed(before[name], stamps) for name, stamps in resting.items()
                 if name in before and name not in acted_on}
        return {name: files for name, files in found.items() if files}

    def _trip_workspace(self, name: str, files: list[str], live: list[str],
                        persons: set[str]) -> dict[str, str]:
        """Files in a workspace whose issue has no worker changed. Under the sandbox no
        worker can reach it, and a held issue is in a person's hands (they may fix its
        workspace; holding every worker for that would punish them): the event only.
        Unconfined, a live worker may have planted them, to be merged as that issue's
        work: the issue is held (a held issue is not merged) and so is every live
        worker's."""
        suspects = [n for n in live if n != name]
        if not suspects:
            return {}  # no other worker ran since the last check: a person's change
        unconfined = self.settings.agent.sandbox == "off" and name not in persons
        held = [name, *suspects] if unconfined else []
        self.store.append_event("tripwire", workspace=name, files=files[:20],
                                live_workers=suspects, held=held,
                                persons_hands=name in persons)
        log.warning("tripwire", workspace=name, files=files[:20], live_workers=suspects)
        if not unconfined:
            return {}
        where = self.settings.workspaces / name
        own = (f"files in {name}'s workspace ({where}) changed while it had no worker, and "
               f"other workers ran unconfined (agent.sandbox = \"off\"): {_listed(files)}. "
               f"They may not be {name}'s work, so it is not merged until a person looks "
               f"(`ralph-dev worker diff {name}`; remove what is not its work)")
        other = (f"files in {name}'s workspace ({where}), which this worker may not touch, "
                 f"changed while it ran unconfined (agent.sandbox = \"off\"): "
                 f"{_listed(files)}. Nothing tells which worker did it, so every live "
                 "one was stopped (its work stays in its workspace). If this one did, its "
                 "issue text may have told it to")
        return {name: own, **dict.fromkeys(suspects, other)}


def _listed(files: list[str]) -> str:
    return ", ".join(files[:10]) + (" …" if len(files) > 10 else "")
