"""A person's config edit applies live, and a restart is not a crash (issue 23), on the
real daemon, controller, tmux, jj and local tracker with the scripted demo agent:

* ``limits.max_workers`` raised in config.toml runs more workers within a tick, with an
  event listing what changed; what only a restart can change is said so, not applied;
* an invalid file changes nothing (the last good config keeps running), is said once,
  and ``status`` still runs and names the file, the key and the problem; fixed, it
  applies at once;
* ``stop``/``start`` are not crashes: only unplanned controller exits count toward the
  crash-loop limit; a controller that starts with an invalid config waits for the fix
  and is back within a tick of it, with no crash loop.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from swarm_kit import Swarm, wait_for

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


def test_a_controller_started_with_an_invalid_config_waits_for_the_fix(swarm: Swarm) -> None:
    swarm.import_plan('[[task]]\ntitle = "A"\n')
    swarm.script = {"*": "hang"}
    swarm.write_script()
    swarm.start()
    wait_for(lambda: _live(swarm) == 1, 60, "a worker")
    pid = swarm.heartbeat()["pid"]
    _edit(swarm, "max_workers = 1", 'max_workers = "three"')
    os.kill(pid, signal.SIGKILL)  # the controller crashes while the file is broken
    wait_for(lambda: swarm.heartbeat().get("config_error"), 60,
             "a new controller, waiting for a valid config")
    waiting = swarm.heartbeat()["pid"]
    doc = json.loads(swarm.cli("status", swarm.project, "--json").stdout)
    assert doc["needs_you"][0]["kind"] == "config" and doc["controller"]["healthy"]
    assert not _events(swarm, "controller_crash_loop")
    _edit(swarm, 'max_workers = "three"', "max_workers = 1")
    wait_for(lambda: not swarm.heartbeat().get("config_error")
             and swarm.heartbeat().get("tick", 0) > 0, 30, "the controller running again")
    assert swarm.heartbeat()["pid"] == waiting  # the same process: no restart was needed
    assert _live(swarm) == 1  # its worker was left alone meanwhile
