"""The controller's promises outside the happy path: one per project, a tracker
outage never touches running workers, failed actions are recorded and
retried, SIGTERM exits cleanly, a red trunk stops merges."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from swarm_kit import Swarm, run_cli, wait_for

from ralph_dev.adapters import mailbox
from ralph_dev.adapters.gh import Gh
from ralph_dev.adapters.jj import JjRepository
from ralph_dev.adapters.store import StateStore
from ralph_dev.adapters.tmux import Tmux
from ralph_dev.adapters.tracker import open_tracker
from ralph_dev.agent.launch import build_launch
from ralph_dev.control.loop.controller import Controller
from ralph_dev.control.loop.run import controller_lock
from ralph_dev.control.loop.wiring import host_for
from ralph_dev.core.config import Timing, load_project
from ralph_dev.core.errors import TrackerUnavailable
from ralph_dev.core.model import Issue

pytestmark = pytest.mark.slow


class FlakyTracker:
    """The real local tracker, with an outage switch for list_issues."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.down = False

    async def list_issues(self) -> list[Issue]:
        if self.down:
            raise TrackerUnavailable("tracker outage (simulated)")
        return await self.inner.list_issues()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


@pytest.fixture
def swarm(tmp_path: Path, jj_bin: str, tmux_socket: str) -> Iterator[Swarm]:
    s = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=2)
    yield s
    s.teardown()


@pytest.fixture
def in_process(swarm: Swarm, monkeypatch: pytest.MonkeyPatch):
    """A controller in this process, on the swarm's real tmux, jj and tracker."""
    for key, value in swarm.env.items():
        monkeypatch.setenv(key, value)
    settings = load_project(swarm.project)
    tmux = Tmux.from_settings(settings)
    tmux.ensure_session(swarm.repo, {"PATH": os.environ["PATH"]})
    tracker = FlakyTracker(open_tracker(settings))
    jj = JjRepository.from_settings(settings)
    ctl = Controller(settings, tracker=tracker, host=host_for(settings, jj), jj=jj,
                     launcher=build_launch,
                     pull_requests=Gh(settings.merge.gh_bin, settings.repo),
                     store=StateStore(settings.paths))
    return ctl, tracker


def _tick(ctl: Controller):
    return asyncio.run(ctl.tick())


def _two_started(swarm: Swarm, ctl: Controller, tasks: int):
    """``tasks`` issues whose workers work a while; the first tick starts two (the
    swarm's ``max_workers``)."""
    swarm.import_plan("".join(f'[[task]]\ntitle = "T{n}"\n' for n in range(tasks)))
    swarm.script = {"*": "work:30"}
    swarm.write_script()
    result = _tick(ctl)
    assert [a.kind for a in result.plan.actions] == ["spawn", "spawn"]
    return result


def test_tracker_outage_skips_dispatch_but_keeps_workers(swarm: Swarm, in_process) -> None:
    ctl, tracker = in_process
    _two_started(swarm, ctl, 3)
    running = wait_for(lambda: len(swarm.worker_windows()) == 2, 20, "two workers")
    assert running
    tracker.down = True
    for _ in range(6):
        result = _tick(ctl)
        assert not result.observed.tracker_ok
        assert all(a.kind not in ("spawn", "kill", "reap", "restart") for a in result.plan.actions)
    assert sorted(swarm.worker_windows()) == ["DEMO-1", "DEMO-2"]  # untouched
    # issue 25: one event when the outage is sure, not one per tick
    (down,) = [e for e in swarm.events() if e["event"] == "tracker_unavailable"]
    assert down["failed_calls"] == 3 and down["error"]
    beat = json.loads((ctl.store.paths.heartbeat_file).read_text())
    assert beat["tracker_ok"] is False  # the heartbeat still beats, and says so
    tracker.down = False
    result = _tick(ctl)
    assert result.observed.tracker_ok  # recovery on the next tick
    (up,) = [e for e in swarm.events() if e["event"] == "tracker_recovered"]
    assert up["failed_calls"] == 6 and up["seconds"] >= 0
    _tick(ctl)
    assert [e["event"] for e in swarm.events()].count("tracker_recovered") == 1


def test_the_workers_a_plan_starts_are_shown_their_change_once_it_is_done(
        swarm: Swarm, in_process) -> None:
    """``run/change.diff`` (what ``worker diff`` reads should the controller be busy) is
    written for each worker a tick started, after its starts: not beside the next one."""
    ctl, _ = in_process
    _two_started(swarm, ctl, 2)
    for ident in ("DEMO-1", "DEMO-2"):
        shown = ctl.dirs.run_dir(ident) / mailbox.DIFF_FILE
        assert wait_for(shown.exists, 20, f"{ident}'s change shown to it")
        assert shown.read_text() == ""  # each starts from trunk: no change yet


def test_failed_action_is_recorded_and_retried(swarm: Swarm, in_process) -> None:
    ctl, _ = in_process
    swarm.import_plan('[[task]]\ntitle = "A"\n')
    real_add = ctl.jj.workspaces.add_workspace
    calls = {"n": 0}

    def flaky_add(name: str, **hooks: object) -> Path:
        calls["n"] += 1
        if calls["n"] == 1:
            from ralph_dev.adapters.jj_cli import JJError

            raise JJError("simulated jj failure", command=["jj", "workspace", "add"],
                          stderr="boom", returncode=1)
        return real_add(name, **hooks)

    ctl.jj.workspaces.add_workspace = flaky_add
    first = _tick(ctl)
    assert [a.kind for a, _ in first.failures] == ["spawn"]
    failed = [e for e in swarm.events() if e["event"] == "action_failed"]
    assert failed and failed[0]["issue"] == "DEMO-1" and "simulated" in failed[0]["error"]
    second = _tick(ctl)  # level-triggered: the same spawn is simply proposed again
    assert [a.kind for a in second.plan.actions] == ["spawn"] and not second.failures
    assert swarm.worker_windows() == ["DEMO-1"]


def test_red_trunk_stops_merges_until_a_person_fixes_it(tmp_path: Path, jj_bin: str,
                                                        tmux_socket: str) -> None:
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=1,
                         # green in every worker's workspace; in the trunk checkout green
                         # only once a person has committed FIXED to trunk
                         verify='test "$(basename "$PWD")" != .ralph-trunk || test -e FIXED')
    try:
        config = swarm.config_file
        config.write_text(config.read_text() + "\n[projects.demo.merge]\nverify_trunk = true\n")
        swarm.import_plan('[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n')
        swarm.start()
        red = swarm.state_dir / "trunk-red.json"
        wait_for(red.exists, 120, "trunk to turn red after DEMO-1's merge")
        assert json.loads(red.read_text())["exit_code"] != 0
        comments = swarm.issue("DEMO-1")["comments"]
        assert any("Merges are paused" in c["body"] for c in comments)
        status = swarm.status()
        assert status["trunk"]["colour"] == "red" and status["trunk"]["red"]["exit_code"] != 0
        assert "trunk_red" in [need["kind"] for need in status["needs_you"]]
        wait_for(lambda: any(e["event"] == "worker_done" for e in swarm.events()
                             if e.get("issue") == "DEMO-2"), 120, "DEMO-2 to finish")

        def merges() -> list[str]:
            return [e["issue"] for e in swarm.events() if e["event"] == "merge"]

        assert merges() == ["DEMO-1"]
        assert "changes/DEMO-2.txt" not in swarm.trunk_files()

        # a person fixes trunk; ralph-dev verifies it again because trunk moved
        jj_env = {**swarm.env, "JJ_USER": "Person", "JJ_EMAIL": "person@example.com"}
        for args in (["new", "main"], ["file", "track", "FIXED"]):
            if args[0] == "file":
                (swarm.repo / "FIXED").write_text("fixed\n")
            subprocess.run([swarm.jj, *args], cwd=swarm.repo, env=jj_env, check=True,
                           capture_output=True)
        for args in (["commit", "-m", "fix trunk"], ["bookmark", "set", "main", "-r", "@-"]):
            subprocess.run([swarm.jj, *args], cwd=swarm.repo, env=jj_env, check=True,
                           capture_output=True)
        wait_for(lambda: not red.exists(), 120, "trunk to be green again")
        wait_for(lambda: "DEMO-2" in merges(), 120, "DEMO-2 to merge after the fix")
        assert any(e["event"] == "trunk_green" for e in swarm.events())
        assert "changes/DEMO-2.txt" in swarm.trunk_files()
        # the person's fix changed the main working copy while DEMO-2's window was still
        # open: under the sandbox that is said (a tripwire event), never held
        swarm.tripwires_expected = True
        tripped = [e for e in swarm.events() if e["event"] == "tripwire"]
        assert all(e["held"] == [] for e in tripped)
        assert all("FIXED" in e["files"] for e in tripped)
    finally:
        swarm.teardown()


def test_one_controller_per_project(xdg: Path, tmp_path: Path) -> None:
    lock = tmp_path / "controller.lock"
    from ralph_dev.control.loop.run import ControllerLocked

    with controller_lock(lock), pytest.raises(ControllerLocked, match=f"pid {os.getpid()}"), \
            controller_lock(lock):
        pass
    with controller_lock(lock):  # released on exit
        pass


def test_second_controller_process_exits_with_a_clear_message(swarm: Swarm) -> None:
    lock = swarm.state_dir / "controller.lock"
    first = subprocess.Popen([sys.executable, "-m", "ralph_dev", "controller", swarm.project],
                             env=swarm.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
    try:
        wait_for(lambda: lock.exists() and lock.read_text().strip() == str(first.pid), 20,
                 "the first controller to hold the lock")
        second = run_cli("controller", swarm.project, env=swarm.env, check=False)
        assert second.returncode != 0
        assert "a controller already runs for this project" in second.stderr
        assert str(first.pid) in second.stderr
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0  # SIGTERM: finish, then exit 0
        events = [e["event"] for e in swarm.events()]
        assert events[-1] == "controller_stopped"
    finally:
        if first.poll() is None:
            first.kill()


def test_plan_json_in_a_fresh_sandbox(swarm: Swarm) -> None:
    swarm.import_plan('[[task]]\nref = "a"\ntitle = "A"\n[[task]]\ntitle = "B"\n'
                      'blocked_by = ["a"]\n[[task]]\ntitle = "C"\npriority = 1\n')
    out = json.loads(swarm.cli("plan", swarm.project, "--json").stdout)
    spawns = [(a["action"], a["issue"], a["role"]) for a in out["actions"]]
    assert spawns == [("spawn", "DEMO-3", "execute"), ("spawn", "DEMO-1", "execute")]
    assert all(a["reason"] for a in out["actions"])
    assert not swarm.worker_windows()  # plan only looks
    assert [i["state_type"] for i in swarm.issues()] == ["unstarted"] * 3


def test_plan_says_why_each_issue_it_leaves_alone_waits(tmp_path: Path, jj_bin: str,
                                                        tmux_socket: str) -> None:
    """Two ready issues and one slot: the plan names the spawn, and says why the other
    waits (what ``status`` says of a running controller's plan)."""
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=1)
    try:
        swarm.import_plan('[[task]]\ntitle = "A"\npriority = 1\n[[task]]\ntitle = "B"\n')
        out = json.loads(swarm.cli("plan", swarm.project, "--json").stdout)
        assert [(a["action"], a["issue"]) for a in out["actions"]] == [("spawn", "DEMO-1")]
        (wait,) = out["waits"]
        assert wait["issue"] == "DEMO-2" and wait["kind"] == "slot"
        assert "1/1" in wait["why"] and set(wait) >= {"until", "attempt", "last_error"}
        lines = swarm.cli("plan", swarm.project).stdout.splitlines()
        assert lines[0].split()[:2] == ["spawn", "DEMO-1"]
        assert lines[1].split()[:3] == ["wait", "DEMO-2", "[slot]"]
        assert wait["why"] in lines[1]
        assert not swarm.worker_windows()  # plan only looks
    finally:
        swarm.teardown()


def test_people_commands_status_events_doctor(swarm: Swarm) -> None:
    swarm.import_plan('[[task]]\ntitle = "A"\n')
    swarm.start()
    wait_for(swarm.all_done, 120, "the issue done")
    status = swarm.status()
    assert status["daemon"]["running"] and status["controller"]["alive"]
    assert status["issues"]["done"] == 1 and status["issues"]["total"] == 1
    assert status["controller"]["heartbeat_age_s"] is not None
    table = swarm.cli("status", swarm.project).stdout
    assert "daemon:     running" in table and "done 1" in table
    events = swarm.cli("events", swarm.project, "--issue", "DEMO-1").stdout
    assert "spawn" in events and "merge" in events
    assert swarm.cli("events", swarm.project, "--since", "1h", "--json").stdout.strip()
    bad = swarm.cli("events", swarm.project, "--since", "yesterday-ish", check=False)
    assert bad.returncode != 0 and "duration like 30m" in bad.stderr
    log = swarm.cli("logs", "DEMO-1").stdout
    assert "[demo agent] DEMO-1" in log and "\x1b" not in log
    doctor = swarm.cli("doctor", swarm.project, check=False)
    assert "[OK  ] tmux" in doctor.stdout and "[OK  ] jj" in doctor.stdout
    assert "[OK  ] tracker demo (local)" in doctor.stdout


def test_doctor_names_what_to_fix(swarm: Swarm, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    refused = swarm.cli("init", "other", "--repo", str(plain), check=False)
    assert refused.returncode != 0 and "not a repository" in refused.stderr
    config = swarm.config_file
    config.write_text(config.read_text() + f'[projects.other]\nrepo = "{plain}"\n')
    doctor = swarm.cli("doctor", "other", check=False)
    assert doctor.returncode != 0
    assert "[FAIL] repo other" in doctor.stdout and "jj git init" in doctor.stdout


def test_a_cli_retrying_by_itself_is_read_from_its_screen() -> None:
    """Claude Code 2.1.197's status line while it retries (issue 24): read from the
    screen, where the whole line stands (its log holds only the redrawn characters)."""
    from ralph_dev.control.loop.observe import RetrySeen, read_retry

    screen = "✻ API error · Retrying in 9s · attempt 6/10\n\n> \n"
    assert read_retry(screen) == RetrySeen("retrying in 9s, attempt 6/10", 9)
    limited = "Rate limited · Retrying in 4m (resets 3:05pm) · attempt 2/10"
    assert read_retry(limited) == RetrySeen("retrying in 4m, attempt 2/10", 240)
    assert read_retry("✻ Thinking… (12s · ↓ 300 tokens · esc to interrupt)") is None


class Screens:
    """A pane's screen as the test scripts it (what ``tmux capture-pane`` would print)."""

    def __init__(self) -> None:
        self.shown = ""
        self.reads = 0

    def capture(self, target: str, lines: int = 40) -> str:
        self.reads += 1
        return self.shown


def test_a_call_a_retrying_cli_announced_is_not_taken_for_hung_while_under_way(
        xdg: Path) -> None:
    """Issue 24's retries, seen by a tick landing while the retry the CLI announced is
    under way: its screen no longer says "Retrying", and for the announced wait plus
    ``hang_timeout`` it is still no hang. Past that, the silence is the call's own, and
    it is hung. (Without the memory of the announced wait it was restarted as hung.)"""
    from test_decide import NOW, rec, settings, win, world

    from ralph_dev.control.loop.observe import RetryWatch
    from ralph_dev.core.model import AWAITING_MODEL

    project = settings(timing=Timing(hang_timeout=10))
    store = StateStore(project.paths)
    store.save_record(rec("DEMO-1", agent_state=AWAITING_MODEL))
    screens = Screens()
    watch = RetryWatch(project, screens, store)

    def seen(now: datetime, quiet_s: float) -> dict[str, str]:
        return watch.read(world(windows=[win("DEMO-1", output_changed_at=now - timedelta(
            seconds=quiet_s))], records=[rec("DEMO-1", agent_state=AWAITING_MODEL)]), now)

    assert seen(NOW, 5) == {} and screens.reads == 0  # not quiet long enough to look
    screens.shown = "✻ API error · Retrying in 8s · attempt 5/10\n> \n"
    assert seen(NOW, 11) == {"DEMO-1": "retrying in 8s, attempt 5/10"}
    assert store.load_record("DEMO-1").last_activity == NOW  # type: ignore[union-attr]
    screens.shown = "✻ Thinking…\n> \n"  # the announced call, under way
    assert seen(NOW + timedelta(seconds=17), 17) == {"DEMO-1": "retrying in 8s, attempt 5/10"}
    assert seen(NOW + timedelta(seconds=19), 19) == {}  # 8 s + 10 s: that call is hung
    screens.reads = 0
    assert watch.read(world(), NOW) == {} and not watch.seen  # its window gone: forgotten


def test_a_pause_ends_at_its_stated_end_not_at_the_next_poll(
        swarm: Swarm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 36: back to work at a usage limit's reset, not at the first poll after it.
    With a two-minute poll the pause still ends at its stated end: the tick that read it
    left the loop due then."""
    from datetime import UTC, datetime, timedelta

    from ralph_dev.adapters.wake import poke
    from ralph_dev.core.agent_faults import USAGE_LIMIT
    from ralph_dev.core.model import Pause

    config = swarm.config_file
    config.write_text(config.read_text().replace("poll_interval = 0.3", "poll_interval = 120"))
    swarm.start()
    swarm.wait_first_tick()
    for key, value in swarm.env.items():
        monkeypatch.setenv(key, value)
    store = StateStore(load_project(swarm.project).paths)
    until = datetime.now(UTC) + timedelta(seconds=4)
    store.set_pause(Pause(kind=USAGE_LIMIT, cause="the model's usage limit was reached",
                          fix="nothing: wait", since=datetime.now(UTC), until=until,
                          quiet_workers=True))
    ticks = swarm.ticks()
    wait_for(lambda: poke(store) and swarm.ticks() > ticks, 30, "a tick that reads the pause")

    def resumed() -> dict | None:
        return next((e for e in swarm.events() if e["event"] == "swarm_resumed"), None)

    wait_for(lambda: resumed() is not None, 40, "the pause's end")
    ended = datetime.fromisoformat(resumed()["time"])  # type: ignore[index]
    assert until <= ended < until + timedelta(seconds=4), ended - until
