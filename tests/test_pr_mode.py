"""PR mode: a finished worker's change is pushed under its bookmark to a real
(local, bare) git remote and a pull request is opened with `gh`; trunk stays.

GitHub cannot run here, so `gh` is a recording stand-in script; jj, git, the
remote, tmux, the daemon and the tracker are real."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from swarm_kit import Swarm, wait_for

pytestmark = pytest.mark.slow

FAKE_GH = """#!/bin/sh
printf '%s\\n' "$@" > "{record}"
echo "https://github.example/acme/app/pull/7"
"""


@pytest.fixture
def swarm(tmp_path: Path, jj_bin: str, tmux_socket: str) -> Iterator[Swarm]:
    s = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=1)
    yield s
    s.teardown()


def test_pr_mode_pushes_the_bookmark_and_opens_a_pull_request(swarm: Swarm,
                                                              tmp_path: Path) -> None:
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    subprocess.run([swarm.jj, "git", "remote", "add", "origin", str(remote)], cwd=swarm.repo,
                   env=swarm.env, check=True, capture_output=True)
    record = tmp_path / "gh-args.txt"
    gh = tmp_path / "gh"
    gh.write_text(FAKE_GH.format(record=record))
    gh.chmod(0o755)
    config = swarm.config_file
    config.write_text(config.read_text()
                      + f'\n[projects.demo.merge]\nmode = "pr"\ngh_bin = "{gh}"\n')
    swarm.import_plan('[[task]]\ntitle = "Add the widget"\n')
    swarm.start()
    wait_for(lambda: swarm.all_done() and not swarm.workspaces(), 120,
             "the issue done and its workspace forgotten")
    wait_for(record.exists, 30, "gh to be called")

    args = record.read_text().splitlines()
    assert args[:2] == ["pr", "create"]
    assert args[args.index("--head") + 1] == "ralph/DEMO-1"
    assert args[args.index("--base") + 1] == "main"
    assert args[args.index("--title") + 1] == "DEMO-1: Add the widget"
    pushed = subprocess.run(["git", "--git-dir", str(remote), "show", "--name-only",
                             "--format=%s", "ralph/DEMO-1"], capture_output=True, text=True,
                            check=True).stdout
    assert "changes/DEMO-1.txt" in pushed and pushed.startswith("DEMO-1: Add the widget")
    assert "changes/DEMO-1.txt" not in swarm.trunk_files()  # trunk did not move
    comments = [c["body"] for c in swarm.issue("DEMO-1")["comments"]]
    assert any("https://github.example/acme/app/pull/7" in body for body in comments)
    events = [e for e in swarm.events() if e["event"] == "pull_request"]
    assert json.dumps(events).count("pull/7") == 1
