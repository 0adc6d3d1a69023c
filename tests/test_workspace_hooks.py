"""Workspace hooks (``[projects.X.hooks]``) through the real controller, tmux and jj:
``after_create`` prepares a new workspace before its agent starts, ``before_remove`` runs
before the workspace goes, both write to the worker's log, and a failing
``after_create`` is a failed spawn with a typed, sensibly retryable error."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from swarm_kit import Swarm, leftovers, wait_for

from ralph_dev.control.loop.controller import Controller, TickResult
from ralph_dev.control.loop.wiring import controller_for, tmux_for
from ralph_dev.core.actions import EndPause
from ralph_dev.core.config import load_project

pytestmark = pytest.mark.slow


@pytest.fixture
def swarm(tmp_path: Path, jj_bin: str, tmux_socket: str,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Swarm]:
    s = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=2)
    s.commit_file(".gitignore", "node_modules/\ntarget/\n")  # as real projects do
    for key, value in s.env.items():
        monkeypatch.setenv(key, value)
    yield s
    s.teardown()


def set_hooks(swarm: Swarm, **hooks: str) -> Controller:
    config = swarm.config_file
    lines = [f"\n[projects.{swarm.project}.hooks]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in hooks.items()]
    config.write_text(config.read_text() + "\n".join(lines) + "\n")
    settings = load_project(swarm.project)
    ctl = controller_for(settings)
    tmux_for(settings).ensure_session(swarm.repo, {"PATH": os.environ["PATH"]})
    return ctl


def tick(ctl: Controller) -> TickResult:
    return asyncio.run(ctl.tick())


def test_hooks_prepare_and_tidy_workspaces_and_their_outputs_go_with_them(
    swarm: Swarm
) -> None:
    removed = swarm.root / "removed.txt"
    ctl = set_hooks(
        swarm,
        after_create=('mkdir -p node_modules/dep target/debug && echo "for $RALPH_DEV_ISSUE" '
                      '> node_modules/dep/index.js && head -c 100000 /dev/zero > target/debug/big'
                      ' && test -f "$RALPH_DEV_REPO/README.md" && echo deps installed'),
        before_remove=f'echo "$RALPH_DEV_ISSUE $(ls node_modules)" >> {removed}',
    )
    swarm.import_plan('[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n')
    first = tick(ctl)
    assert [a.kind for a in first.plan.actions] == ["spawn", "spawn"] and not first.failures
    for issue in ("DEMO-1", "DEMO-2"):  # ready before the agent started
        assert (ctl.jj.workspaces.workspace_path(issue) / "node_modules/dep/index.js").exists()
    disk = swarm.status()["disk"]  # status shows what the build outputs cost
    assert all(disk["workspaces"][i] >= 100_000 for i in ("DEMO-1", "DEMO-2")), disk

    def finished() -> bool:
        tick(ctl)
        return swarm.all_done() and not swarm.workspaces()

    wait_for(finished, 90, "both issues merged and their workspaces removed", interval=0.5)
    root = ctl.jj.home.root
    assert not leftovers(root)  # nothing left behind
    assert sorted(removed.read_text().splitlines()) == ["DEMO-1 dep", "DEMO-2 dep"]
    assert "node_modules/dep/index.js" not in swarm.trunk_files()
    log = ctl.store.log_path("DEMO-1").read_text()
    assert "[ralph-dev] after_create hook:" in log and "deps installed" in log
    assert log.index("deps installed") < log.index("[demo agent] DEMO-1")  # before the agent
    assert "[ralph-dev] before_remove hook exited 0" in log


def test_a_hook_that_cannot_run_pauses_the_swarm_until_a_restart(swarm: Swarm) -> None:
    """Issue 9: a missing command (exit 127) fails every spawn the same way: the swarm
    pauses once with the fix, no issue is charged or held, and the controller that
    starts with a fixed config lifts the pause and starts the issue."""
    ctl = set_hooks(swarm, after_create="no-such-installer --frozen")
    swarm.import_plan('[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n')
    first = tick(ctl)
    assert [a.kind for a, _ in first.failures] == ["spawn"]  # the second never started
    for _ in range(3):
        assert not [a for a in tick(ctl).plan.actions if a.kind == "spawn"]
    paused = [e for e in swarm.events() if e["event"] == "swarm_paused"]
    assert len(paused) == 1 and "hooks.after_create" in paused[0]["fix"]
    record = ctl.store.load_record("DEMO-1")
    assert record is not None and record.attempts == 0 and record.last_failure_at is None
    assert all(i["state"] == "Todo" for i in swarm.issues())
    assert not [e for e in swarm.events() if e["event"] == "hold"]

    config = swarm.config_file
    config.write_text(config.read_text().replace('"no-such-installer --frozen"', '"true"'))
    fixed = controller_for(load_project(swarm.project))  # a person fixed it and restarted
    result = tick(fixed)  # the first tick with the config read again ends the pause
    assert [a.pause_kind for a in result.plan.actions if isinstance(a, EndPause)] == ["hook"]
    assert not fixed.store.load_pauses()
    assert sorted(a.issue for a in result.plan.actions if a.kind == "spawn") == [
        "DEMO-1", "DEMO-2"]
    assert not result.failures


@pytest.mark.parametrize(("command", "retryable"), [
    ("echo 'npm ERR! network timeout' && exit 3", True),
    ("no-such-installer --frozen", False),
])
def test_a_failing_after_create_is_a_failed_spawn(swarm: Swarm, command: str,
                                                  retryable: bool) -> None:
    ctl = set_hooks(swarm, after_create=command)
    swarm.import_plan('[[task]]\ntitle = "A"\n')
    result = tick(ctl)
    assert [a.kind for a, _ in result.failures] == ["spawn"]
    failed = [e for e in swarm.events() if e["event"] == "action_failed"]
    assert failed[-1]["retryable"] is retryable
    assert "after_create hook" in failed[-1]["error"] and "DEMO-1.log" in failed[-1]["error"]
    record = ctl.store.load_record("DEMO-1")
    assert record and record.last_failure and "after_create" in record.last_failure
    assert not swarm.worker_windows() and not swarm.workspaces()
    assert not ctl.jj.workspaces.workspace_path("DEMO-1").exists()
    log = ctl.store.log_path("DEMO-1").read_text()
    assert "after_create hook exited" in log
    if retryable:
        assert "npm ERR! network timeout" in log and "npm ERR!" in failed[-1]["error"]
