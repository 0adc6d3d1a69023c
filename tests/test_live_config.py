"""A person's config edit applies live, and a restart is not a crash (issue 23), on the
real daemon, controller, tmux, jj and local tracker with the scripted demo agent:

* ``limits.max_workers`` raised in config.toml runs more workers within a tick, with an
  event listing what changed; what only a restart can change is said so, not applied;
* an invalid file changes nothing (the last good config keeps running), is said once,
  and ``status`` still runs and names the file, the key and the problem; fixed, it
  applies at once;
* ``stop``/``start`` are not crashes: only unplanned controller exits count toward the
  crash-loop limit; a controller that starts with an invalid config and no good one
  kept waits for the fix and is back within a tick of it, with no crash loop;
* a bad edit never takes down what runs (issue 33): a controller whose file turns
  invalid in its first second, or that is restarted while it is, runs on the last good
  config; the commands that read (``events``, ``status``, ``logs``, ``issue list``,
  ``plan``) work meanwhile, with a warning naming the file and the problem.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from swarm_kit import Swarm, wait_for

from ralph_dev.adapters.config_file import LAST_GOOD

pytestmark = pytest.mark.slow

THREE = '[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n[[task]]\ntitle = "C"\n'


@pytest.fixture
def swarm(tmp_path: Path, jj_bin: str, tmux_socket: str) -> Iterator[Swarm]:
    s = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=1)
    yield s
    s.teardown()


def _edit(swarm: Swarm, old: str, new: str) -> None:
    """A person edits the config while workers run: under the sandbox, the tripwire on the
    config file says so (an event), and the controller reads it."""
    swarm.tripwires_expected = True
    text = swarm.config_file.read_text()
    assert old in text, text
    swarm.config_file.write_text(text.replace(old, new, 1))


def _events(swarm: Swarm, kind: str) -> list[dict]:
    return [e for e in swarm.events() if e["event"] == kind]


def _live(swarm: Swarm) -> int:
    return len(swarm.worker_windows())


def _started(swarm: Swarm) -> None:
    """Three issues whose workers never finish, and the swarm started on them."""
    swarm.import_plan(THREE)
    swarm.script = {"*": "hang"}
    swarm.write_script()
    swarm.start()


def test_a_config_edit_applies_within_a_tick_and_says_what_changed(swarm: Swarm) -> None:
    _started(swarm)
    wait_for(lambda: _live(swarm) == 1, 60, "one worker (max_workers = 1)")
    _edit(swarm, "max_workers = 1", "max_workers = 3")
    _edit(swarm, 'key = "DEMO"', 'key = "DEMO"\nlinear_poll_interval = 45')
    wait_for(lambda: _live(swarm) == 3, 30, "three workers once the edit is read")
    (reloaded,) = _events(swarm, "config_reloaded")
    assert reloaded["changed"] == ["limits.max_workers"]
    assert reloaded["restart_needed"] == ["tracker.linear_poll_interval"]
    assert not _events(swarm, "controller_start")[1:]  # no restart was needed for it

    def told() -> list[dict]:  # status says what waits for a restart, until one
        doc = json.loads(swarm.cli("status", swarm.project, "--json").stdout)
        return [n for n in doc["needs_you"] if "restart" in n["message"]]

    wait_for(told, 10, "status naming the setting that waits for a restart")
    assert "tracker.linear_poll_interval" in told()[0]["message"]


def test_an_invalid_config_keeps_the_last_good_one_running_and_says_so_once(
        swarm: Swarm) -> None:
    _started(swarm)
    wait_for(lambda: _live(swarm) == 1, 60, "one worker")
    _edit(swarm, "max_workers = 1", 'max_workers = "three"')
    wait_for(lambda: _events(swarm, "config_invalid"), 30, "the invalid file noticed")
    swarm.wait_first_tick()
    first = swarm.ticks()
    wait_for(lambda: swarm.ticks() >= first + 5, 30, "five more ticks")
    (invalid,) = _events(swarm, "config_invalid")  # once, not every tick
    assert "max_workers" in invalid["error"] and str(swarm.config_file) in invalid["file"]
    assert _live(swarm) == 1  # the last good config: still one worker, still working
    shown = swarm.cli("status", swarm.project)  # status still runs, and says what is wrong
    assert "config is invalid" in shown.stdout and "max_workers" in shown.stdout
    doc = json.loads(swarm.cli("status", swarm.project, "--json").stdout)
    assert doc["needs_you"][0]["kind"] == "config"
    _edit(swarm, 'max_workers = "three"', "max_workers = 2")
    wait_for(lambda: _live(swarm) == 2, 30, "the fixed file applied")
    assert _events(swarm, "config_reloaded")[-1]["changed"] == ["limits.max_workers"]


def test_stop_and_start_are_not_crashes(tmp_path: Path, jj_bin: str,
                                        tmux_socket: str) -> None:
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=1,
                         timing={"crash_loop_restarts": 2, "crash_loop_window": 900})
    try:
        def started(before: object) -> object:
            swarm.start()
            wait_for(lambda: swarm.heartbeat().get("pid") not in (None, before)
                     and swarm.ticks() >= 1, 30, "a new controller's first tick")
            return swarm.heartbeat()["pid"]

        pid = None
        for _ in range(3):  # a person restarts the swarm, again and again
            pid = started(pid)
            swarm.stop()
        pid = started(pid)
        os.kill(pid, signal.SIGKILL)  # then one real crash
        wait_for(lambda: swarm.heartbeat().get("pid") not in (None, pid), 60,
                 "a new controller after the crash")
        assert not _events(swarm, "controller_crash_loop")
        assert [e["planned"] for e in _events(swarm, "controller_start")] == [
            True, True, True, True, False]
    finally:
        swarm.teardown()


def test_a_controller_started_with_an_invalid_config_and_none_good_waits_for_the_fix(
        swarm: Swarm) -> None:
    swarm.import_plan('[[task]]\ntitle = "A"\n')
    swarm.script = {"*": "hang"}
    swarm.write_script()
    swarm.start()
    wait_for(lambda: _live(swarm) == 1, 60, "a worker")
    pid = swarm.heartbeat()["pid"]
    _edit(swarm, "max_workers = 1", 'max_workers = "three"')
    (swarm.state_dir / LAST_GOOD).unlink()  # no good config is known (never kept)
    os.kill(pid, signal.SIGKILL)  # the controller crashes while the file is broken
    wait_for(lambda: swarm.heartbeat().get("pid") not in (None, pid)
             and swarm.heartbeat().get("config_error"), 60,
             "a new controller, waiting for a valid config")
    waiting = swarm.heartbeat()["pid"]
    assert swarm.heartbeat()["tick"] == 0  # waiting, and beating: healthy, no restart
    shown = swarm.cli("status", swarm.project, check=False)  # no good config to show
    assert shown.returncode == 1 and "max_workers" in shown.stderr
    said = swarm.cli("events", swarm.project).stdout  # the events need none
    assert "waiting for a fix to start" in said
    assert not _events(swarm, "controller_crash_loop")
    _edit(swarm, 'max_workers = "three"', "max_workers = 1")
    wait_for(lambda: not swarm.heartbeat().get("config_error")
             and swarm.heartbeat().get("tick", 0) > 0, 30, "the controller running again")
    assert swarm.heartbeat()["pid"] == waiting  # the same process: no restart was needed
    assert _live(swarm) == 1  # its worker was left alone meanwhile


def test_a_controller_whose_config_breaks_in_its_first_second_keeps_running(
        swarm: Swarm) -> None:
    """The daemon read the file valid and started the controller; the edit lands before
    the controller (or its first tick) read it: it runs on the config the swarm started
    with, says the file is invalid, and works on."""
    swarm.import_plan(THREE)
    swarm.start()
    _edit(swarm, "max_workers = 1", 'max_workers = "three"')
    wait_for(lambda: swarm.ticks() >= 1, 60, "the controller's first tick")
    pid = swarm.heartbeat()["pid"]
    wait_for(swarm.all_done, 180, "every issue done, on the last good config")
    (invalid,) = _events(swarm, "config_invalid")
    assert "max_workers" in invalid["error"] and invalid["file"] == str(swarm.config_file)
    beat = swarm.heartbeat()
    assert beat["pid"] == pid and "max_workers" in beat["config_error"]
    ticks = swarm.ticks()
    wait_for(lambda: swarm.ticks() > ticks, 10, "the same controller still beating")
    assert swarm.heartbeat()["pid"] == pid
    assert len(_events(swarm, "controller_start")) == 1  # never restarted
    assert not _events(swarm, "controller_killed")
    assert {e["issue"] for e in _events(swarm, "spawn")} == {"DEMO-1", "DEMO-2", "DEMO-3"}
    doc = swarm.status()
    assert doc["needs_you"][0]["kind"] == "config" and doc["controller"]["healthy"]


def test_a_controller_restarted_while_the_config_is_invalid_runs_on_the_last_good_one(
        swarm: Swarm) -> None:
    swarm.import_plan(THREE)
    swarm.script = {"*": "hang"}
    swarm.write_script()
    swarm.start()
    wait_for(lambda: _live(swarm) == 1, 60, "a worker")
    pid = swarm.heartbeat()["pid"]
    _edit(swarm, "max_workers = 1", 'max_workers = "three"')
    os.kill(pid, signal.SIGKILL)  # the controller crashes while the file is broken
    wait_for(lambda: swarm.heartbeat().get("pid") not in (None, pid)
             and swarm.ticks() >= 1, 60, "a new controller ticking")
    again = swarm.heartbeat()
    assert "max_workers" in again["config_error"]
    (said,) = [e for e in _events(swarm, "config_invalid")
               if e["why"] == "the controller starts on the last good config"]
    assert "max_workers" in said["error"]
    assert _live(swarm) == 1  # its worker adopted, max_workers still 1
    _edit(swarm, 'max_workers = "three"', "max_workers = 2")
    wait_for(lambda: _live(swarm) == 2, 30, "the fixed file applied")
    assert swarm.heartbeat()["pid"] == again["pid"]
    assert not swarm.heartbeat().get("config_error")
    assert _events(swarm, "config_reloaded")[-1]["changed"] == ["limits.max_workers"]


def _warned(swarm: Swarm, args: tuple[str, ...], problem: str) -> str:
    """The command ran, and said on stderr that the file is invalid, why, and that the last
    good config is used."""
    done = swarm.cli(*args, check=False)
    assert done.returncode == 0, f"{args}: {done.stderr}"
    assert f"warning: the config file {swarm.config_file} is invalid" in done.stderr, args
    assert problem in done.stderr and "last good config" in done.stderr, done.stderr
    return done.stdout


def test_commands_that_read_work_while_the_config_is_invalid(swarm: Swarm) -> None:
    swarm.import_plan('[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n')
    swarm.script = {"DEMO-1": "work:0.2", "*": "hang"}
    swarm.write_script()
    swarm.start()
    wait_for(lambda: swarm.issue("DEMO-1")["state_type"] == "completed", 120, "DEMO-1 done")
    wait_for(lambda: _live(swarm) == 1, 60, "DEMO-2's worker")
    p = swarm.project
    _edit(swarm, "max_workers = 1", 'max_workers = "three"')
    assert "spawn" in _warned(swarm, ("events", p), "max_workers")
    assert "merge" in _warned(swarm, ("events", p, "--issue", "DEMO-1"), "max_workers")
    assert "config is invalid" in _warned(swarm, ("status", p), "max_workers")
    doc = json.loads(_warned(swarm, ("status", p, "--json"), "max_workers"))
    assert doc["needs_you"][0]["kind"] == "config"
    assert "DEMO-1" in _warned(swarm, ("issue", "list", p), "max_workers")
    assert "DEMO-1" in _warned(swarm, ("issue", "show", "DEMO-1"), "max_workers")
    _warned(swarm, ("logs", "DEMO-1"), "max_workers")
    _warned(swarm, ("logs", "controller", "--project", p), "max_workers")
    plan = json.loads(_warned(swarm, ("plan", p, "--json"), "max_workers"))
    assert plan["project"] == p and "waits" in plan
    _warned(swarm, ("plan", p), "max_workers")

    # a file that is not even TOML any more: the same, all projects' status too
    _edit(swarm, 'max_workers = "three"', 'max_workers = "three')
    for args in (("events", p), ("status",), ("issue", "list", p), ("logs", "DEMO-1"),
                 ("plan", p)):
        _warned(swarm, args, "not valid TOML")
    stopped = _warned(swarm, ("stop", p, "--workers"), "not valid TOML")  # it stops, too
    assert "stopped daemon" in stopped and not swarm.daemon_pid()

    # no good config kept at all: the events need none (they are in the project's state
    # dir); what needs the config says what is wrong, as ever
    (swarm.state_dir / LAST_GOOD).unlink()
    events = swarm.cli("events", p, check=False)
    assert events.returncode == 0 and "spawn" in events.stdout
    assert "not valid TOML" in events.stderr and "no good config" in events.stderr
    status = swarm.cli("status", p, check=False)
    assert status.returncode == 1 and "not valid TOML" in status.stderr
