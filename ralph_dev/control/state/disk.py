"""How much disk the workers' workspaces take, for ``ralph-dev status``.

Agents' build outputs (node_modules/, target/) are per workspace and add up
fast, so status shows the sizes; measuring walks every file, so the figures
are cached for a few minutes in the project's state directory.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ralph_dev.adapters.files import atomic_write_text
from ralph_dev.core.config import ProjectSettings

MEASURE_EVERY = 300.0
"""Seconds a measurement is reused before the workspaces are walked again."""


def disk_usage(path: Path) -> int:
    """Bytes ``path`` occupies on disk (like ``du -s``): symlinks are not followed,
    and files that vanish while walking (a build running) are skipped."""
    total = 0
    stack = [path]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += info.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
    return total


def workspace_sizes(settings: ProjectSettings, *, now: float | None = None) -> dict[str, Any]:
    """``{"measured_s_ago": …, "total_bytes": …, "workspaces": {name: bytes}}`` for every
    directory under the workspace root (ralph-dev's own dotted ones count in the total)."""
    now = time.time() if now is None else now
    cache = settings.paths.state_dir / "workspace-sizes.json"
    root = settings.workspaces
    names = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    try:
        cached = json.loads(cache.read_text())
        fresh = now - float(cached["measured_at"]) < MEASURE_EVERY
        if fresh and sorted(cached["sizes"]) == names:
            return _report(cached["sizes"], now - float(cached["measured_at"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    sizes = {name: disk_usage(root / name) for name in names}
    atomic_write_text(cache, json.dumps({"measured_at": now, "sizes": sizes}) + "\n")
    return _report(sizes, 0.0)


def _report(sizes: dict[str, int], age: float) -> dict[str, Any]:
    return {"measured_s_ago": round(age, 1), "total_bytes": sum(sizes.values()),
            "workspaces": {k: v for k, v in sizes.items() if not k.startswith(".")}}


def human_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB"):
        if count < 1000:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} GB"
