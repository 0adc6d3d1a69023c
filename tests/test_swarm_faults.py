"""Faults, each converging to the same end state: every issue Done (or, for the
always-failing one, held for a person) and nothing left running."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from swarm_kit import Swarm, wait_for

pytestmark = pytest.mark.slow

FOUR_TASKS = """
[[task]]
title = "Alpha"
[[task]]
title = "Beta"
[[task]]
title = "Gamma"
[[task]]
title = "Delta"
"""


@pytest.fixture
def swarm(tmp_path: Path, jj_bin: str, tmux_socket: str) -> Iterator[Swarm]:
    s = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=2,
                     timing={"stall_timeout": 3, "restart_timeout": 3, "max_attempts": 2})
    yield s
    s.teardown()


def _cleaned(swarm: Swarm) -> bool:
    return not swarm.worker_windows() and not swarm.workspaces()


def _events(swarm: Swarm, kind: str, issue: str | None = None) -> list[dict]:
    return [e for e in swarm.events()
            if e["event"] == kind and (issue is None or e.get("issue") == issue)]


def _pane_pid(swarm: Swarm, window: str) -> int:
    out = swarm.tmux("list-panes", "-a", "-F", "#{window_name} #{pane_pid}").stdout
    pids = [int(line.split()[1]) for line in out.splitlines() if line.split()[0] == window]
    assert pids, f"no pane for {window}"
    return pids[0]


def test_controller_killed_is_restarted_by_daemon(swarm: Swarm) -> None:
    swarm.import_plan(FOUR_TASKS)
    swarm.script = {"*": "work:2"}
    swarm.write_script()
    swarm.start()
    wait_for(swarm.worker_windows, 60, "a worker")
    first = _pane_pid(swarm, "controller")
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: len(_events(swarm, "controller_start")) >= 2, 60, "controller restarted")
    wait_for(swarm.all_done, 180, "every issue Done")
    wait_for(lambda: _cleaned(swarm), 60, "clean up")
    spawns = [e["issue"] for e in _events(swarm, "spawn")]
    # never a second worker for one issue; a spawn interrupted by the kill -9 may have
    # no event (events are written once an action completes) but its worker was adopted
    assert len(spawns) == len(set(spawns)) >= 3
    assert len(_events(swarm, "worker_done")) == 4
    logs = swarm.state_dir / "logs"
    for n in range(1, 5):  # each pane log shows exactly one agent start
        text = (logs / f"DEMO-{n}.log").read_text(errors="replace")
        assert text.count("ralph-dev: starting") == 1, f"DEMO-{n}"


def test_killed_worker_is_respawned_and_counted(swarm: Swarm) -> None:
    swarm.import_plan(FOUR_TASKS)
    swarm.script = {"*": "work:0.3", "DEMO-1": "work:30"}
    swarm.write_script()
    swarm.start()
    wait_for(lambda: "DEMO-1" in swarm.worker_windows(), 60, "DEMO-1's worker")
    swarm.script["DEMO-1"] = "work:0.3"
    swarm.write_script()
    os.kill(_pane_pid(swarm, "DEMO-1"), signal.SIGKILL)
    wait_for(swarm.all_done, 180, "every issue Done")
    assert _events(swarm, "reap", "DEMO-1"), "the dead pane was reaped"
    attempts = [e.get("attempt") for e in _events(swarm, "spawn", "DEMO-1")]
    assert attempts == [1, 2]


def test_a_persons_done_on_a_running_issue_stops_it_and_keeps_its_change(
        swarm: Swarm) -> None:
    """Issue 23: a person's Done on a running issue stops its worker; its unfinished
    change is not merged but kept under its bookmark, and the comment names the command
    that merges it, which works as written."""
    swarm.import_plan(FOUR_TASKS)
    swarm.script = {"*": "work:0.3", "DEMO-2": "write-hang"}
    swarm.write_script()
    swarm.start()
    log = swarm.state_dir / "logs/DEMO-2.log"
    wait_for(lambda: log.exists() and "now hangs" in log.read_text(errors="replace"), 60,
             "DEMO-2 to write its change")
    swarm.cli("issue", "state", "DEMO-2", "Done")
    wait_for(swarm.all_done, 180, "every issue Done")
    wait_for(lambda: _cleaned(swarm), 60, "clean up")
    kinds = [e["event"] for e in swarm.events() if e.get("issue") == "DEMO-2"]
    assert "stop" in kinds and "merge" not in kinds and "action_failed" not in kinds
    assert "changes/DEMO-2.txt" not in swarm.trunk_files()
    bookmarks = swarm.jj_out("bookmark", "list", "-T", 'name ++ "\\n"').split()
    assert "ralph/DEMO-2" in bookmarks  # the change is kept
    comment = next(c["body"] for c in swarm.issue("DEMO-2")["comments"]
                   if "completed while its worker ran" in c["body"])
    command = comment.split("`")[1]  # the command that merges it, as a person runs it
    swarm.stop()
    subprocess.run(["sh", "-c", command.replace("jj ", f"{swarm.jj} ", 2)], cwd=swarm.repo,
                   env=swarm.env, check=True, capture_output=True)
    assert "changes/DEMO-2.txt" in swarm.trunk_files()


def test_stuck_worker_is_nudged_then_restarted(swarm: Swarm) -> None:
    swarm.import_plan(FOUR_TASKS)
    swarm.script = {"*": "work:0.3", "DEMO-3": "hang-once"}
    swarm.write_script()
    swarm.start()
    wait_for(swarm.all_done, 180, "every issue Done")
    kinds = [e["event"] for e in swarm.events() if e.get("issue") == "DEMO-3"]
    assert "nudge" in kinds and "restart" in kinds
    assert kinds.index("nudge") < kinds.index("restart")
    assert kinds.count("nudge") >= 1


def test_always_failing_issue_is_held_and_the_rest_continues(swarm: Swarm) -> None:
    swarm.import_plan(FOUR_TASKS)
    swarm.script = {"*": "work:0.3", "DEMO-4": "fail"}
    swarm.write_script()
    swarm.start()

    def settled() -> bool:
        issues = {i["identifier"]: i for i in swarm.issues()}
        others_done = all(i["state_type"] == "completed"
                          for k, i in issues.items() if k != "DEMO-4")
        return others_done and "user-input-needed" in issues["DEMO-4"]["labels"]

    wait_for(settled, 180, "others Done and DEMO-4 held")
    held = swarm.issue("DEMO-4")
    assert held["state_type"] != "completed"
    assert any("user-input-needed" in c["body"] or "attempt" in c["body"]
               for c in held["comments"])
    assert len(_events(swarm, "spawn", "DEMO-4")) + len(_events(swarm, "restart", "DEMO-4")) == 2
    assert len(_events(swarm, "hold", "DEMO-4")) == 1


def test_daemon_killed_and_started_again_adopts_workers(swarm: Swarm) -> None:
    swarm.import_plan(FOUR_TASKS)
    swarm.script = {"*": "work:4"}
    swarm.write_script()
    swarm.start()
    wait_for(lambda: len(swarm.worker_windows()) == 2, 60, "two workers")
    pid = wait_for(swarm.daemon_pid, 10, "daemon pid")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not _alive(pid), 10, "daemon gone")
    swarm.start()
    wait_for(swarm.all_done, 180, "every issue Done")
    spawns = _events(swarm, "spawn")
    assert len(spawns) == len({e["issue"] for e in spawns}) == 4  # no duplicates


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (killed child not yet reaped) counts as gone
    try:
        return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") < 0
    except OSError:
        return False
