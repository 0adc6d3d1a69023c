"""A whole swarm run on a person's real repository (a plain git repo with uncommitted and
untracked work, colocated by ``init --colocate``): afterwards every byte of their
checkout, git's index and their ``@`` are as they were, both their git and jj's still
open the repository, and their git shows trunk's branch at the merged work."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from swarm_kit import Swarm, assert_git_reads, checkout_state, git, wait_for

pytestmark = pytest.mark.slow

PLAN = """
[[task]]
ref = "a"
title = "Storage"
[[task]]
title = "API"
blocked_by = ["a"]
[[task]]
title = "Docs"
[[task]]
title = "Logging"
"""


@pytest.fixture
def swarm(tmp_path: Path, jj_bin: str, tmux_socket: str) -> Iterator[Swarm]:
    s = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=3, person=True)
    yield s
    s.teardown()


@pytest.mark.parametrize("person", ["git user", "jj user"])
def test_a_swarm_run_leaves_the_persons_checkout_byte_identical(swarm: Swarm, jj_bin: str,
                                                                person: str) -> None:
    if person == "jj user":  # jj has detached git's HEAD at the person's change
        subprocess.run([jj_bin, "new"], cwd=swarm.repo, check=True, capture_output=True,
                       env={**swarm.env, "JJ_USER": "Pat", "JJ_EMAIL": "pat@example.com"})
    status = git(swarm.repo, "status", "--porcelain").stdout  # (refreshes git's index)
    before = checkout_state(swarm.repo, jj_bin)
    identifiers = swarm.import_plan(PLAN)

    swarm.start()
    wait_for(lambda: swarm.all_done() and not swarm.workspaces(), timeout=180,
             what="every issue merged and its workspace removed")
    swarm.stop()

    after = checkout_state(swarm.repo, jj_bin)
    if person == "git user":
        # HEAD was on main, which moved: jj detached it at the same commit, so the
        # checkout still matches HEAD; the person runs `git checkout main` to catch up
        assert after["git_HEAD_file"] == after["HEAD"] + "\n"
        assert before["git_HEAD_file"] == "ref: refs/heads/main\n"
        before["git_HEAD_file"] = after["git_HEAD_file"]
    assert after == before
    assert git(swarm.repo, "status", "--porcelain").stdout == status
    assert_git_reads(swarm.repo, jj_bin)
    subjects = git(swarm.repo, "log", "--format=%s", "main").stdout.splitlines()
    assert sorted(s.split(":")[0] for s in subjects[:-1]) == sorted(identifiers)
    assert subjects[-1] == "initial commit"
    trunk = swarm.jj_out("log", "--no-graph", "-r", "main", "-T", "commit_id")
    assert git(swarm.repo, "rev-parse", "main").stdout.strip() == trunk
    # status says where trunk is (what the person pulls), and that its reading changed nothing
    shown = swarm.status()["trunk"]
    assert (shown["name"], shown["head"], shown["subject"]) == ("main", trunk, subjects[0])
    assert f"trunk:      main at {trunk[:12]}, unverified: {subjects[0]}" in swarm.cli(
        "status", swarm.project).stdout
    assert checkout_state(swarm.repo, jj_bin) == after
