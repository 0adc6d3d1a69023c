"""Issue 26 item 4 with the real Claude Code CLI: an agent on a cluster host is killed
mid-task; its next attempt, in a workspace of another name (and maybe on another
host), resumes the same session, because its transcript came back to the controller
when the attempt ended and went out again with the next launch. Hosts share nothing
with the controller here but the git remote and the scripted model on loopback."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import test_claude_smoke
from conftest import retry_until
from ray_kit import hosts_dir, local_cluster
from test_claude_smoke import FAKE_KEY, World, two_steps_with_a_crash, working_in

from ralph_dev.core.config import ClusterSettings, Timing
from ralph_dev.core.model import NewIssue, StateType
from ralph_dev.devtools.scripted_model import FakeAnthropic

pytest.importorskip("ray", reason="ray is not installed (pip install 'ralph-dev[ray]')")

pytestmark = [pytest.mark.slow, pytest.mark.claude]


claude_bin = test_claude_smoke.claude_bin  # the fixtures this test builds on
world = test_claude_smoke.world

@pytest.fixture
def on_a_cluster(world: World, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                 jj_bin: str) -> Iterator[tuple[World, Any]]:
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    world.jj.cli.run("git", "remote", "add", "origin", str(remote), touch_checkout=True).check()
    base = tmp_path_factory.getbasetemp()
    with local_cluster(base, "demo", connect=False) as made:
        made.hosts = hosts_dir(base)
        world.settings = dataclasses.replace(
            world.settings, cluster=ClusterSettings(engine="ray", address=made.address,
                                                    remote=None, snapshot_interval=2.0),
            timing=Timing(poll_interval=0.5, retry_base=0.5, retry_cap=1))
        yield world, made


def cluster_ticks(world: World) -> tuple[Callable[[], Any], Callable[[], None]]:
    from ralph_dev.adapters.gh import Gh
    from ralph_dev.agent.launch import build_launch
    from ralph_dev.control.loop.controller import Controller
    from ralph_dev.control.loop.wiring import ray_host_for

    host = ray_host_for(world.settings, world.jj, world.store)
    ctl = Controller(world.settings, tracker=world.tracker, host=host, jj=world.jj,
                     launcher=build_launch, pull_requests=Gh("gh", world.settings.repo),
                     store=world.store)
    loop = asyncio.new_event_loop()  # one loop: the relay's tasks live across ticks

    def close() -> None:
        loop.run_until_complete(ctl.server.close())
        # the relay's last calls end before Ray does: a call left inside ray.get when
        # the connection shuts down never returns
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
        host.plane.close()

    return (lambda: loop.run_until_complete(ctl.tick())), close


def test_an_agent_killed_on_its_host_resumes_its_session_in_the_next_attempt(
        on_a_cluster: tuple[World, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    world, made = on_a_cluster
    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Two steps")])
    crashed = {"yet": False}

    with FakeAnthropic(two_steps_with_a_crash(issue, crashed)) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        tick, close = cluster_ticks(world)
        try:
            tick()
            # deadlines, not speed: a loaded host starts a Ray worker and its Claude Code
            # in seconds alone, in minutes beside a full test run
            retry_until(lambda: (tick(), len(api.main_messages()) >= 2)[1], 240,
                        what="the second model call")
            # the SessionStart hook's news, written on the host, relayed here
            retry_until(lambda: (tick(), world.store.load_record(issue).session_id)[1], 90,
                        what="the session id, relayed from the host")
            first = world.store.load_record(issue)
            # a placement that timed out under load spends a fence number too
            assert first.node and first.transcript and first.host_attempt
            worker_file = world.settings.paths.worker_dir(issue) / "run" / "worker.json"
            workspace = Path(json.loads(worker_file.read_text())["workspace"])  # on its host
            crashed["yet"] = True
            for pid in working_in(workspace):  # kill -9 of the agent and its shells
                os.kill(pid, signal.SIGKILL)
            retry_until(lambda: (tick(), world.tracker.get_sync(issue).state_type
                                 is StateType.COMPLETED)[1], 360,
                        what="the issue done after its agent died on its host")
        finally:
            close()
        events = list(world.store.iter_events())
        starts = [e for e in events if e["event"] in ("spawn", "restart")]
        assert [e["host_attempt"] for e in starts] == [first.host_attempt,
                                                       first.host_attempt + 1], starts
        assert not [e for e in events if e["event"] == "session_fresh"], events
        later = [m for m in api.main_messages()[2:] if "SessionStart:resume" in json.dumps(m)]
        assert later, "the next attempt did not resume the session"
        history = json.dumps(later[0]["messages"])
        assert "SessionStart:startup" in history  # the first attempt's start, carried on
        assert "continuation of your own earlier session" in history
    # the API key reached each host in a secrets file its launcher read and deleted; no
    # copy stays there, nor here
    hosts = made.hosts  # every node's HOME and XDG dirs
    assert not list(hosts.rglob("*.secrets.json"))
    assert not list(world.settings.paths.prompts_dir.glob("*.secrets.json"))
    assert not [p for p in hosts.rglob("*") if p.is_file() and not p.is_symlink()
                and p.stat().st_size < 2**20 and FAKE_KEY.encode() in p.read_bytes()]
