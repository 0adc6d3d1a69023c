"""Admission by resources: a new worker starts only while the host can carry it.

Other orchestrators' users report hosts driven out of memory by agents (OOM kills,
hundreds of processes). Before each tick the controller samples free memory
(``MemAvailable``), the 1-minute load average per CPU and the free space of the
workspaces' filesystem; below a floor of ``limits`` it pauses dispatch swarm-wide
(``Pause(kind="resources")``: nothing starts, nothing is charged, running workers go
on), saying which figure and why, once; it lifts the pause once every figure is back
with a 10 % margin, so it does not flap at the edge.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ralph_dev.adapters.store import StateStore
from ralph_dev.core.config import Limits, ProjectSettings
from ralph_dev.core.model import Pause

RESOURCES_PAUSE = "resources"
MARGIN = 1.1


@dataclass(frozen=True)
class Resources:
    free_memory_mb: float | None
    free_disk_mb: float | None
    load_per_cpu: float | None


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def sample(workspaces: Path) -> Resources:
    """What the host has now; a figure it cannot read is None (never a reason to wait)."""
    memory = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                memory = int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        memory = None
    try:
        disk: float | None = shutil.disk_usage(_existing(workspaces)).free / 2**20
    except OSError:
        disk = None
    try:
        load: float | None = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        load = None
    return Resources(memory, disk, load)


def shortage(have: Resources, limits: Limits, margin: float = 1.0) -> str | None:
    """Why a new worker must wait (every figure short of its floor), or None."""
    short = []
    if have.free_memory_mb is not None and have.free_memory_mb < limits.min_free_memory_mb * margin:
        short.append(f"{have.free_memory_mb:.0f} MB of memory available, below "
                     f"limits.min_free_memory_mb = {limits.min_free_memory_mb}")
    if have.free_disk_mb is not None and have.free_disk_mb < limits.min_free_disk_mb * margin:
        short.append(f"{have.free_disk_mb:.0f} MB free for workspaces, below "
                     f"limits.min_free_disk_mb = {limits.min_free_disk_mb}")
    ceiling = limits.max_load_per_cpu
    if ceiling > 0 and have.load_per_cpu is not None and have.load_per_cpu > ceiling / margin:
        short.append(f"load {have.load_per_cpu:.1f} per CPU, above "
                     f"limits.max_load_per_cpu = {ceiling:g}")
    return "; ".join(short) or None


def admit(settings: ProjectSettings, store: StateStore, clock: Callable[[], datetime],
          have: Resources | None = None) -> None:
    """Pause dispatch while the host is short of a resource; lift it once it is not."""
    have = have if have is not None else sample(settings.workspaces)
    paused = any(p.kind == RESOURCES_PAUSE for p in store.load_pauses())
    why = shortage(have, settings.limits, MARGIN if paused else 1.0)
    if why is not None and not paused:
        store.set_pause(Pause(kind=RESOURCES_PAUSE, cause=f"the host is short: {why}",
                              fix="free memory or disk, or wait for the load to drop; or "
                                  "change the floor named in the cause",
                              since=clock()))
    elif why is None and paused:
        store.clear_pause(RESOURCES_PAUSE, why="the host has room again")
