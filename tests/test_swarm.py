"""The swarm end to end on the embedded default: real daemon, controller, tmux,
jj and local tracker; scripted agents as workers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import make_jj_repo
from swarm_kit import Swarm, attach_fake_linear, event_times, max_concurrency, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def swarm(tmp_path: Path, jj_bin: str, tmux_socket: str) -> Iterator[Swarm]:
    s = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=3)
    yield s
    s.teardown()


@pytest.fixture(params=["local", "linear"])
def any_tracker_swarm(request: pytest.FixtureRequest, swarm: Swarm,
                      tmp_path: Path) -> Iterator[Swarm]:
    """The same swarm on the embedded tracker and on (fake) Linear over GraphQL."""
    if request.param == "local":
        yield swarm
        return
    fake, _, _ = attach_fake_linear(swarm, tmp_path)
    try:
        yield swarm
    finally:
        swarm.stop()
        fake.stop()


def test_twelve_issue_dag_runs_to_completion(any_tracker_swarm: Swarm) -> None:
    swarm = any_tracker_swarm
    identifiers = swarm.import_plan()
    assert len(identifiers) == 12
    issues = {i["identifier"]: i for i in swarm.issues()}
    parents = {i["identifier"] for i in issues.values() if i["children"]}
    leaves = set(identifiers) - parents

    swarm.start()
    wait_for(swarm.all_done, timeout=240, what="every issue Done")
    wait_for(lambda: not swarm.worker_windows() and not swarm.workspaces(), timeout=60,
             what="windows and workspaces cleaned up")
    swarm.stop()

    # trunk holds every leaf's change exactly once
    files = swarm.trunk_files()
    for ident in leaves:
        assert files.count(f"changes/{ident}.txt") == 1, ident
    trunk_log = swarm.jj_out("log", "-r", "::main", "--no-graph", "-T", 'description ++ "\\n"')
    for ident in leaves:
        assert sum(line.startswith(f"{ident}:") for line in trunk_log.splitlines()) == 1, ident

    events = swarm.events()
    spawned = event_times(events, "spawn")
    merged = event_times(events, "merge")
    assert set(spawned) == leaves  # containers are completed, never worked on
    assert set(merged) == leaves
    # dependencies were never violated: a blocked issue starts after its blockers merged
    for ident, issue in issues.items():
        for blocker in issue["blocked_by"]:
            for dependent in ([ident] if ident in leaves else issue["children"]):
                blockers = [blocker] if blocker in leaves else issues[blocker]["children"]
                for b in blockers:
                    assert spawned[dependent] > merged[b], (dependent, b)
    assert max_concurrency(events) <= 3
    assert max_concurrency(events) >= 2  # and the swarm did run in parallel
    # the events log tells the story, with a reason for every action
    for event in events:
        if event["event"] in ("spawn", "merge", "forget", "kill", "complete"):
            assert event.get("reason"), event


def test_start_twice_refuses_and_stop_then_start_resumes(swarm: Swarm) -> None:
    swarm.import_plan()
    swarm.script = {"*": "work:3"}
    swarm.write_script()
    swarm.start()
    pid = wait_for(swarm.daemon_pid, timeout=20, what="daemon pid")
    second = swarm.cli("start", swarm.project, check=False)
    assert second.returncode != 0
    assert f"pid {pid}" in second.stderr
    wait_for(lambda: swarm.worker_windows(), timeout=60, what="a worker running")

    swarm.stop(workers=False)
    workers_after_stop = swarm.worker_windows()
    assert workers_after_stop  # workers keep running by default
    swarm.script = {"*": "work:0.2"}
    swarm.write_script()
    swarm.start()
    wait_for(swarm.all_done, timeout=240, what="every issue Done after restart")
    spawns = [e for e in swarm.events() if e["event"] == "spawn"]
    assert len({e["issue"] for e in spawns}) == len(spawns)  # never two workers for one issue


def test_start_all_and_stop_all_take_every_configured_project(swarm: Swarm,
                                                              tmp_path: Path) -> None:
    """Issue 36: one command starts (and stops) every project of the config; a command
    naming neither a project nor --all says how to."""
    agent = next(line for line in swarm.config_file.read_text().splitlines()
                 if line.startswith("command = "))
    swarm.cli("init", "second", "--repo", str(make_jj_repo(tmp_path / "second")), "--agent",
              "command", "--agent-command", json.loads(agent.split(" = ", 1)[1]),
              "--key", "SEC")
    neither = swarm.cli("start", check=False)
    assert neither.returncode == 2 and "--all" in neither.stderr
    try:
        started = swarm.cli("start", "--all")
        assert "started for demo" in started.stdout, started
        assert "started for second" in started.stdout, started
        projects = json.loads(swarm.cli("status", "--json").stdout)["projects"]
        assert sorted(p["project"] for p in projects) == ["demo", "second"]
        stopped = swarm.cli("stop", "--all")
        assert stopped.stdout.count("stopped daemon pid") == 2, stopped
    finally:
        swarm.cli("stop", "--all", check=False)
