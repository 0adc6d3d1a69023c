"""Workspace sizes for ``status``: like ``du``, never following links, measured at most
every few minutes (walking node_modules is not free)."""

from __future__ import annotations

from pathlib import Path

from ralph_dev.control.state.disk import MEASURE_EVERY, disk_usage, human_bytes, workspace_sizes
from ralph_dev.core.config import ProjectSettings


def test_sizes_are_measured_like_du_and_reused_for_a_while(xdg: Path, tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    settings = ProjectSettings(name="app", repo=tmp_path, workspace_root=root)
    deps = root / "APP-1" / "node_modules" / "dep"
    deps.mkdir(parents=True)
    (deps / "index.js").write_bytes(b"x" * 200_000)
    (root / "APP-1" / "outside").symlink_to(tmp_path)  # must not count what it points to
    (root / ".ralph-base").mkdir()
    (tmp_path / "huge").write_bytes(b"y" * 5_000_000)

    first = workspace_sizes(settings, now=1000.0)
    assert 200_000 <= first["workspaces"]["APP-1"] < 1_000_000
    assert list(first["workspaces"]) == ["APP-1"]  # ralph-dev's own dirs only in the total
    assert first["total_bytes"] >= first["workspaces"]["APP-1"]
    assert disk_usage(root / "APP-1") == first["workspaces"]["APP-1"]

    (deps / "more.js").write_bytes(b"x" * 300_000)
    again = workspace_sizes(settings, now=1000.0 + MEASURE_EVERY / 2)
    assert again["workspaces"] == first["workspaces"]  # cached
    assert again["measured_s_ago"] == MEASURE_EVERY / 2
    (root / "APP-2").mkdir()  # a new workspace: measured now
    assert set(workspace_sizes(settings, now=1001.0)["workspaces"]) == {"APP-1", "APP-2"}
    later = workspace_sizes(settings, now=1001.0 + MEASURE_EVERY + 1)
    assert later["workspaces"]["APP-1"] >= 500_000


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (512, 2_500, 3_400_000, 12_000_000_000)] == [
        "512 B", "2.5 kB", "3.4 MB", "12.0 GB"]
