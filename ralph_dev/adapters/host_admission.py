"""The host's workers, shared by every project's controller on it (``[host] max_workers``).

Each controller keeps one file here, ``PROJECT.json``: its load (``core.host_share``)
and, for each of its workers on this host, the process that is that worker (its pane's
process, or, while it starts, the controller itself). A worker counts while that process
lives, so a killed controller leaks nothing: its workers count as long as they run, its
half-made starts not at all, and what it wanted stops counting with it.

Admission is checked under one lock (``flock`` on ``admission.lock``, dropped by the
kernel with its holder): two controllers admitting at the same moment see each other's
claims, and the host's limit is never exceeded. The files are rewritten each tick from
what the controller saw (level-triggered); a claim adds to its project's file between
two ticks.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ralph_dev.adapters.files import atomic_write_text, private_dir
from ralph_dev.adapters.host import sample as host_resources
from ralph_dev.core.errors import HostUnavailable
from ralph_dev.core.host_share import ProjectLoad, host_allowance, host_said
from ralph_dev.core.model import Resources
from ralph_dev.core.paths import state_home

LOCK_WAIT = 10.0
"""Seconds to wait for the host's admission lock (each holder keeps it for one file read
and write)."""


STARTING = 60.0
"""Seconds a worker's process is taken to be starting: it may not have taken its memory
yet, so the host's memory admission counts what it will need (``HostRoom``)."""


@dataclass(frozen=True)
class HostRoom:
    """What one more worker needs of the host besides a place: free memory above the
    floor once every worker still starting, all projects together, has taken its share,
    and a load below the ceiling."""

    min_free_memory_mb: float
    worker_memory_mb: float
    max_load_per_cpu: float
    """0: no ceiling."""


class HostFull(HostUnavailable):
    """The host's workers are all taken by the projects on it: no attempt is charged;
    the issue starts when one is free."""


def host_dir() -> Path:
    """Where the projects on this host publish their loads (this user's, like tmux)."""
    return state_home() / "host"


TICKS = os.sysconf("SC_CLK_TCK")
"""Clock ticks per second: the unit of a process's start time in ``/proc``."""


def seconds_since_boot() -> float:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def started_at(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None if it is not
    running: a pid and its start time name one process, never a later one reusing
    the pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) < 20 or fields[0] == "Z":  # exited, not yet reaped
        return None
    return int(fields[19])


@dataclass(frozen=True)
class Holder:
    """The process a worker's place on the host lives with."""

    pid: int
    started: int | None

    @classmethod
    def of(cls, pid: int) -> Holder:
        return cls(pid, started_at(pid))

    def alive(self) -> bool:
        return self.started is not None and started_at(self.pid) == self.started

    def starting(self, controller: Holder | None) -> bool:
        """Its worker may not have taken its memory yet: its start is under way (its
        place is still held by the controller starting it), or its process is young."""
        if controller is not None and self.pid == controller.pid:
            return True
        return self.started is not None and seconds_since_boot() - self.started / TICKS \
            < STARTING

    def as_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "started": self.started}


@dataclass
class Published:
    """One project's file."""

    load: ProjectLoad = field(default_factory=ProjectLoad)
    controller: Holder | None = None
    workers: dict[str, Holder] = field(default_factory=dict)

    def live_load(self) -> ProjectLoad:
        """Its load now: the workers whose processes live; what it wants only while its
        controller does."""
        wants = self.controller is not None and self.controller.alive()
        used = sum(1 for holder in self.workers.values() if holder.alive())
        return ProjectLoad(used=used, wanting=self.load.wanting if wants else 0,
                           top_priority=self.load.top_priority, share=self.load.share)

    def as_json(self) -> dict[str, Any]:
        return {"load": self.load.as_json(),
                "controller": self.controller.as_json() if self.controller else None,
                "workers": {issue: h.as_json() for issue, h in sorted(self.workers.items())}}

    @classmethod
    def from_json(cls, data: Any) -> Published:
        if not isinstance(data, dict):
            return cls()

        def holder(raw: Any) -> Holder | None:
            if not isinstance(raw, dict) or not isinstance(raw.get("pid"), int):
                return None
            started = raw.get("started")
            return Holder(raw["pid"], started if isinstance(started, int) else None)

        load = data.get("load")
        load = load if isinstance(load, dict) else {}
        try:
            loaded = ProjectLoad(used=0, wanting=int(load.get("wanting", 0)),
                                 top_priority=int(load.get("top_priority", 0)),
                                 share=float(load.get("share", 1.0)))
        except (TypeError, ValueError):
            loaded = ProjectLoad()
        workers = data.get("workers")
        workers = workers if isinstance(workers, dict) else {}
        return cls(load=loaded, controller=holder(data.get("controller")),
                   workers={str(k): h for k, v in workers.items()
                            if (h := holder(v)) is not None})


class HostAdmission:
    """This project's view of the host's workers, and its admissions to them."""

    def __init__(self, project: str, directory: Path | None = None,
                 sample: Callable[[], Resources] | None = None) -> None:
        self.project = project
        self.directory = directory or host_dir()
        self.me = Holder.of(os.getpid())
        self.sample = sample or (lambda: host_resources(self.directory))
        """The host's free memory and load now (``adapters.host.sample``)."""

    def _file(self, project: str) -> Path:
        return self.directory / f"{project}.json"

    def _read(self, path: Path) -> Published:
        try:
            return Published.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return Published()

    def loads(self, *, own: bool = False) -> dict[str, ProjectLoad]:
        """Every other project's load on the host now (this project's own is what its
        controller sees of its workers; ``own``: as published, too, for ``status``)."""
        if not self.directory.is_dir():
            return {}
        found = {}
        for path in sorted(self.directory.glob("*.json")):
            if own or path.stem != self.project:
                found[path.stem] = self._read(path).live_load()
        return found

    def publish(self, load: ProjectLoad, workers: Mapping[str, int]) -> None:
        """This project's load and its live workers (issue → its pane's process), as
        this tick saw them, before it acts: every start of an earlier tick has opened
        its window (or failed) by then."""
        with self._locked():
            self._write(Published(load=load, controller=self.me, workers={
                issue: Holder.of(pid) for issue, pid in workers.items()}))

    @contextlib.contextmanager
    def admit(self, issue: str, *, max_workers: int, share: float, top_priority: int,
              room: HostRoom | None = None) -> Iterator[None]:
        """A place on the host for ``issue``'s worker, held by this controller until the
        worker's process holds it (``hold``); given back if the start fails.
        Raises ``HostFull`` when the host's rule leaves this project none, or (``room``)
        when the host's memory or load has no room for one more worker now."""
        with self._locked():
            mine = self._read(self._file(self.project))
            loads = self.loads()
            own = mine.live_load()
            loads[self.project] = ProjectLoad(
                used=own.used, wanting=max(own.wanting, 1),
                top_priority=top_priority, share=share)
            if host_allowance(self.project, loads, max_workers) < 1:
                raise HostFull(f"{issue}: the host has no free worker for this project "
                               f"({host_said(loads, max_workers)}, [host] max_workers); "
                               "no attempt charged, it starts when one is free")
            if room is not None and (short := self._short(room)) is not None:
                raise HostFull(f"{issue}: the host has no room for one more worker now "
                               f"({short}); no attempt charged, it starts when there is")
            mine.workers[issue] = self.me
            mine.controller = self.me
            self._write(mine)
        try:
            yield
        except BaseException:
            self._release(issue)
            raise

    def starting(self) -> int:
        """Workers on the host, all projects together, that may not have taken their
        memory yet."""
        count = 0
        for path in sorted(self.directory.glob("*.json")):
            published = self._read(path)
            controller = published.controller if published.controller is not None \
                and published.controller.alive() else None
            count += sum(1 for holder in published.workers.values()
                         if holder.alive() and holder.starting(controller))
        return count

    def _short(self, room: HostRoom) -> str | None:
        """What the host lacks for one more worker now, or None. Read under the
        admission lock: each start counts every one admitted before it."""
        have = self.sample()
        starting = self.starting()
        need = room.min_free_memory_mb + room.worker_memory_mb * (starting + 1)
        if have.free_memory_mb is not None and have.free_memory_mb < need:
            return (f"{have.free_memory_mb:.0f} MB of memory available; {starting} "
                    f"worker(s) starting and this one take {room.worker_memory_mb:.0f} MB "
                    "each ([host] worker_memory_mb) above limits.min_free_memory_mb = "
                    f"{room.min_free_memory_mb:.0f}")
        if room.max_load_per_cpu > 0 and have.load_per_cpu is not None \
                and have.load_per_cpu > room.max_load_per_cpu:
            return (f"load {have.load_per_cpu:.1f} per CPU, above limits.max_load_per_cpu "
                    f"= {room.max_load_per_cpu:g}")
        return None

    def hold(self, issue: str, pid: int | None) -> None:
        """``issue``'s worker runs as process ``pid``: its place lives with it."""
        if pid is None:
            return  # held by this controller until the next tick publishes the window
        with self._locked():
            mine = self._read(self._file(self.project))
            mine.workers[issue] = Holder.of(pid)
            self._write(mine)

    def _release(self, issue: str) -> None:
        with self._locked():
            mine = self._read(self._file(self.project))
            if mine.workers.pop(issue, None) is not None:
                self._write(mine)

    def _write(self, published: Published) -> None:
        atomic_write_text(self._file(self.project), json.dumps(published.as_json()) + "\n")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        private_dir(self.directory)
        with (self.directory / "admission.lock").open("a") as handle:
            deadline = time.monotonic() + LOCK_WAIT
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise HostFull("the host's admission lock is held by another "
                                       f"controller for over {LOCK_WAIT:g}s; tried again "
                                       "next tick") from None
                    time.sleep(0.01)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

