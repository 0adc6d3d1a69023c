"""What the host has free: memory, disk for the workspaces, load per CPU, and its CPUs.

Other orchestrators' users report hosts driven out of memory by agents (OOM kills,
hundreds of processes); ``decide`` pauses dispatch while a figure is short of its
floor (``limits``). A figure this host cannot give is None, never a reason to wait.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ralph_dev.core.model import Resources


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def sample(workspaces: Path) -> Resources:
    """What the host has now (``MemAvailable``, the workspaces' filesystem, 1-minute load)."""
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
    return Resources(memory, disk, load, os.cpu_count())
