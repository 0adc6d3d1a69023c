"""Every failure ends somewhere (issue 9), on real jj, tmux and the real controller:

* a missing agent program pauses dispatch swarm-wide, charges no attempt, moves no
  issue to In Progress, and dispatch resumes by itself once the program appears;
* a merge that fails in a way retrying may fix waits a backoff, never keeps the merge
  slot from the issue behind it, and is held for a person after ``max_attempts``;
* a merge refused for good (two lines of work) is held at once with a comment whose
  suggested fix works when followed literally.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from swarm_kit import Swarm, wait_for

from ralph_dev.adapters.gh import Gh
from ralph_dev.adapters.jj import JjRepository
from ralph_dev.adapters.jj_cli import JJInterrupted
from ralph_dev.adapters.store import StateStore
from ralph_dev.adapters.tmux import Tmux
from ralph_dev.adapters.tracker import open_tracker
from ralph_dev.adapters.tracker.linear.errors import LinearAuthError
from ralph_dev.agent.launch import build_launch, check_agent
from ralph_dev.control.loop.controller import Controller
from ralph_dev.control.loop.wiring import host_for
from ralph_dev.core.config import ProjectSettings, load_project
from ralph_dev.core.errors import TrackerUnavailable

pytestmark = pytest.mark.slow


@pytest.fixture
def swarm(tmp_path: Path, jj_bin: str, tmux_socket: str) -> Iterator[Swarm]:
    s = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=2)
    yield s
    s.teardown()


def in_process(swarm: Swarm, monkeypatch: pytest.MonkeyPatch) -> Controller:
    """The controller as the daemon wires it (with its agent check), in this process."""
    for key, value in swarm.env.items():
        monkeypatch.setenv(key, value)
    settings: ProjectSettings = load_project(swarm.project)
    tmux = Tmux.from_settings(settings)
    tmux.ensure_session(swarm.repo, {"PATH": os.environ["PATH"]})
    jj = JjRepository.from_settings(settings)
    return Controller(settings, tracker=open_tracker(settings), host=host_for(settings, jj),
                      jj=jj, launcher=build_launch,
                      pull_requests=Gh(settings.merge.gh_bin, settings.repo),
                      store=StateStore(settings.paths),
                      agent_check=check_agent)


def tick(ctl: Controller) -> Any:
    return asyncio.run(ctl.tick())


def labels(swarm: Swarm, issue: str) -> list[str]:
    return list(swarm.issue(issue)["labels"])


def test_a_missing_agent_pauses_dispatch_and_charges_nobody(
        swarm: Swarm, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = swarm.shared / "bin"  # where the sandboxed workers can see it (not /tmp)
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    swarm.env["PATH"] = f"{bin_dir}:{swarm.env['PATH']}"
    config = swarm.config_file
    text = config.read_text()
    demo_agent = f"{shlex.quote(sys.executable)} -m ralph_dev.devtools.demo_agent"
    assert demo_agent in text
    config.write_text(text.replace(demo_agent, "ralph-test-agent"))  # not installed yet
    swarm.import_plan('[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n')
    ctl = in_process(swarm, monkeypatch)

    for _ in range(3):
        result = tick(ctl)
        assert not [a for a in result.plan.actions if a.kind in ("spawn", "restart")]
    paused = [e for e in swarm.events() if e["event"] == "swarm_paused"]
    assert len(paused) == 1, paused  # said once, not every tick
    assert "ralph-test-agent" in paused[0]["cause"] and "fix" in paused[0]
    assert all(i["state"] == "Todo" for i in swarm.issues())  # nobody In Progress
    assert not list(ctl.store.paths.records_dir.glob("DEMO-*.json"))  # no attempt

    agent = bin_dir / "ralph-test-agent"  # a person installs it
    agent.write_text(f"#!/bin/sh\nexec {demo_agent} \"$@\"\n")
    agent.chmod(0o755)
    result = tick(ctl)
    assert [a.kind for a in result.plan.actions] == ["endpause", "spawn", "spawn"]
    assert [a.attempt for a in result.plan.actions if a.kind == "spawn"] == [1, 1]
    assert any(e["event"] == "swarm_resumed" for e in swarm.events())
    wait_for(lambda: (tick(ctl), swarm.all_done())[1], 90, "both issues done")


def test_a_failing_merge_backs_off_and_does_not_block_the_next_one(
        tmp_path: Path, jj_bin: str, tmux_socket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=2, verify="true")
    try:
        config = swarm.config_file
        config.write_text(config.read_text() + "\n[projects.demo.merge]\nverify_trunk = true\n")
        swarm.import_plan('[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n')
        ctl = in_process(swarm, monkeypatch)
        real_prepare = ctl.jj.merger.prepare_merge
        tried: list[str] = []

        def prepare_merge(name: str) -> Any:
            tried.append(name)
            if name == "DEMO-1":  # killed every time, as by an OOM killer
                raise JJInterrupted("jj was killed (simulated)", command=["jj", "rebase"])
            return real_prepare(name)

        ctl.jj.merger.prepare_merge = prepare_merge  # type: ignore[method-assign]
        wait_for(lambda: (tick(ctl), "DEMO-2" in tried and "user-input-needed"
                          in labels(swarm, "DEMO-1"))[1], 120,
                 "DEMO-2 merged while DEMO-1's merge keeps failing, then DEMO-1 held")
        assert "changes/DEMO-2.txt" in swarm.trunk_files()  # the slot was not blocked
        assert "changes/DEMO-1.txt" not in swarm.trunk_files()
        assert tried.count("DEMO-1") == 3  # max_attempts, each after a backoff, not per tick
        comment = swarm.issue("DEMO-1")["comments"][-1]["body"]
        assert "merge failed 3 times" in comment and "simulated" in comment
        assert "user-feedback-given" in comment  # how a person lets it go on
        for _ in range(3):
            tick(ctl)
        assert tried.count("DEMO-1") == 3  # held: left alone
    finally:
        swarm.teardown()


def test_two_lines_of_work_joined_as_jj_suggests_are_merged(
        swarm: Swarm, monkeypatch: pytest.MonkeyPatch) -> None:
    """`jj new h1 h2` (what the "separate lines of work" refusal tells an agent to do)
    makes an empty merge on top: that is the one head, and both lines reach trunk."""
    swarm.import_plan('[[task]]\ntitle = "A"\n')
    ctl = in_process(swarm, monkeypatch)
    workspace = ctl.jj.workspaces.workspace_path("DEMO-1")
    jj_env = {**swarm.env, "JJ_USER": "Agent", "JJ_EMAIL": "agent@example.com"}

    def jj(*args: str) -> str:
        return subprocess.run([swarm.jj, *args], cwd=workspace, env=jj_env, check=True,
                              capture_output=True, text=True).stdout

    swarm.script = {"*": "hang"}  # the agent's own work is done by hand below
    swarm.write_script()
    tick(ctl)
    wait_for(workspace.exists, 20, "DEMO-1's workspace")
    heads = []
    for name in ("one", "two"):
        jj("new", "main")
        (workspace / f"{name}.txt").write_text(f"{name}\n")
        jj("describe", "-m", f"line {name}")
        heads.append(jj("log", "--no-graph", "-r", "@", "-T", "commit_id").strip()[:12])
    jj("new", *heads)  # joined, as the refusal says
    ctl.store.update_record("DEMO-1", done=True)  # as `worker done` leaves it
    wait_for(lambda: (tick(ctl), {"one.txt", "two.txt"} <= set(swarm.trunk_files()))[1], 60,
             "both lines of work merged")
    assert "user-input-needed" not in labels(swarm, "DEMO-1")
    held = [e for e in swarm.events() if e["event"] == "hold"]
    assert held == []


def test_what_a_research_worker_wrote_never_reaches_trunk(
        swarm: Swarm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 12: a worker without edit rights may still write files (Bash): its
    workspace is never merged, and what it wrote stays reachable for a person."""
    swarm.import_plan('[[task]]\ntitle = "Find out"\nlabels = ["ralph:research"]\n')
    ctl = in_process(swarm, monkeypatch)
    wait_for(lambda: (tick(ctl), swarm.issue("DEMO-1")["state_type"] == "completed"
                      and not swarm.workspaces())[1], 60, "the research issue done")
    assert "changes/DEMO-1.txt" not in swarm.trunk_files()
    kept = swarm.jj_out("file", "list", "-r", "ralph/DEMO-1").split()
    assert "changes/DEMO-1.txt" in kept  # not lost: under its bookmark
    forgets = [e for e in swarm.events() if e["event"] == "forget"]
    assert "research worker's workspace is not merged" in forgets[-1]["reason"]
    assert not [e for e in swarm.events() if e["event"] == "merge"]


def test_a_persons_tracker_write_wakes_the_controller(
        tmp_path: Path, jj_bin: str, tmux_socket: str) -> None:
    """Issue 9: `issue add` pokes the running controller: the new issue starts long
    before the next poll (60 s here)."""
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket,
                         timing={"poll_interval": 60, "heartbeat_stale": 300})
    try:
        swarm.start()
        swarm.wait_first_tick()  # the next poll is a minute away
        swarm.cli("issue", "add", swarm.project, "Started at once")
        wait_for(lambda: any(e["event"] == "spawn" for e in swarm.events()), 5,
                 "the spawn, long before the next poll")
    finally:
        swarm.teardown()


def test_a_controller_stopped_mid_spawn_charges_no_attempt(
        tmp_path: Path, jj_bin: str, tmux_socket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed (or frozen and replaced) between writing the worker record and opening its
    window: the next controller starts the worker again without charging an attempt
    (with max_attempts = 1 a charged one would hold the issue)."""
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, timing={"max_attempts": 1})
    try:
        swarm.import_plan('[[task]]\ntitle = "A"\n')
        first = in_process(swarm, monkeypatch)

        def dies(*args: object, **kwargs: object) -> None:
            raise SystemExit("killed -9 (simulated)")

        first.host.open_window = dies  # type: ignore[method-assign]
        with pytest.raises(SystemExit):
            tick(first)
        assert first.store.load_record("DEMO-1").attempts == 1
        second = in_process(swarm, monkeypatch)
        result = tick(second)
        assert [(a.kind, a.attempt) for a in result.plan.actions] == [("spawn", 1)]
        assert "no attempt charged" in result.plan.actions[0].reason
        wait_for(lambda: (tick(second), swarm.all_done())[1], 60, "DEMO-1 done")
        assert not [e for e in swarm.events() if e["event"] == "hold"]
    finally:
        swarm.teardown()


def test_an_unusable_repository_pauses_the_swarm_and_touches_no_worker(
        swarm: Swarm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 9: trunk's bookmark deleted (or jj gone) under a running worker: the swarm
    pauses once with jj's fix, nothing is killed, forgotten or charged, and it resumes
    by itself when the repository is usable again."""
    swarm.import_plan('[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n')
    swarm.script = {"*": "hang"}
    swarm.write_script()
    ctl = in_process(swarm, monkeypatch)
    first = tick(ctl)
    assert [a.kind for a in first.plan.actions] == ["spawn", "spawn"]
    trunk = swarm.jj_out("log", "--no-graph", "-r", "main", "-T", "commit_id").strip()
    subprocess.run([swarm.jj, "bookmark", "delete", "main"], cwd=swarm.repo, env=swarm.env,
                   check=True, capture_output=True)
    assert [a.kind for a in tick(ctl).plan.actions] == ["pauseswarm"]  # said once
    for _ in range(2):
        result = tick(ctl)
        assert not result.plan.actions  # it acts on nothing it cannot see
    paused = [e for e in swarm.events() if e["event"] == "swarm_paused"]
    assert len(paused) == 1 and "no trunk bookmark 'main'" in paused[0]["cause"], paused
    assert sorted(swarm.worker_windows()) == ["DEMO-1", "DEMO-2"]  # left alone
    assert sorted(swarm.workspaces()) == ["DEMO-1", "DEMO-2"]
    assert all(ctl.store.load_record(i).attempts == 1 for i in ("DEMO-1", "DEMO-2"))
    assert "repository" in swarm.cli("status", swarm.project).stdout

    ctl.jj.cli._jj_bin = "/nonexistent/jj"  # jj uninstalled meanwhile: still paused, said once
    tick(ctl)
    assert len([e for e in swarm.events() if e["event"] == "swarm_paused"]) == 1
    ctl.jj.cli._jj_bin = None

    subprocess.run([swarm.jj, "bookmark", "create", "main", "-r", trunk], cwd=swarm.repo,
                   env=swarm.env, check=True, capture_output=True)  # the fix it named
    tick(ctl)
    assert any(e["event"] == "swarm_resumed" for e in swarm.events())
    assert not ctl.store.load_pauses()
    assert sorted(swarm.worker_windows()) == ["DEMO-1", "DEMO-2"]


def test_a_tracker_that_refuses_the_key_pauses_once_and_resumes(
        swarm: Swarm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 9: a revoked key is a setup error (paused, said once, nothing charged),
    not an outage reported every tick; a key that works again lifts it."""
    swarm.import_plan('[[task]]\ntitle = "A"\n')
    ctl = in_process(swarm, monkeypatch)
    real_list = ctl.tracker.list_issues

    async def refused() -> Any:  # what Linear answers a revoked key (it cannot run here)
        raise LinearAuthError("Linear refused the API key (AUTHENTICATION_ERROR): put a "
                              "valid key in tracker.linear_api_key_file")

    monkeypatch.setattr(ctl.tracker, "list_issues", refused)
    assert [a.kind for a in tick(ctl).plan.actions] == ["pauseswarm"]  # said once
    for _ in range(2):
        assert not tick(ctl).plan.actions
    paused = [e for e in swarm.events() if e["event"] == "swarm_paused"]
    assert len(paused) == 1 and "refuses ralph-dev" in paused[0]["cause"]
    assert "linear_api_key_file" in paused[0]["cause"]
    monkeypatch.setattr(ctl.tracker, "list_issues", real_list)
    result = tick(ctl)
    assert [a.kind for a in result.plan.actions] == ["endpause", "spawn"]
    assert any(e["event"] == "swarm_resumed" for e in swarm.events())


def test_a_tracker_outage_during_merge_costs_nothing_and_loses_nothing(
        swarm: Swarm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 9: the tracker goes down while the worker finishes. The merge still
    happens (it needs only jj), nothing is charged or held, and the tracker writes
    owed (the done comment, the state) are made exactly once when it is back."""
    swarm.import_plan('[[task]]\ntitle = "A"\n')
    ctl = in_process(swarm, monkeypatch)
    tracker = ctl.tracker
    swarm.script = {"*": "work:2"}
    swarm.write_script()
    assert [a.kind for a in tick(ctl).plan.actions] == ["spawn"]

    def down(*_: Any, **__: Any) -> Any:
        raise TrackerUnavailable("the tracker is down (simulated outage)")

    for name in ("list_issues", "get", "comment", "set_state", "add_labels",
                 "remove_labels", "create_issues"):
        monkeypatch.setattr(tracker, name, down)
    wait_for(lambda: (tick(ctl), "changes/DEMO-1.txt" in swarm.trunk_files())[1], 60,
             "DEMO-1 merged while the tracker is down")
    assert not [e for e in swarm.events() if e["event"] == "hold"]
    monkeypatch.undo()  # the tracker is back
    for key, value in swarm.env.items():
        monkeypatch.setenv(key, value)
    wait_for(lambda: (tick(ctl), swarm.issue("DEMO-1")["state_type"] == "completed")[1], 30,
             "the owed tracker writes made")
    for _ in range(3):
        tick(ctl)
    bodies = [c["body"] for c in swarm.issue("DEMO-1")["comments"]]
    assert sum("[ralph-dev] DEMO-1 done" in b for b in bodies) == 1, bodies
    assert "user-input-needed" not in labels(swarm, "DEMO-1")
    assert not swarm.workspaces()
