"""The swarm comes back by itself: after its tmux server dies, after its controller
freezes holding the lock, and with every failed health check on record."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog
from swarm_kit import Swarm, wait_for
from test_jj import make_repo

from ralph_dev.adapters import logs
from ralph_dev.adapters.jj import JjRepository
from ralph_dev.adapters.jj_cli import JJInterrupted

pytestmark = pytest.mark.slow

TASKS = '[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n[[task]]\ntitle = "C"\n'


@pytest.fixture
def swarm(tmp_path: Path, jj_bin: str, tmux_socket: str) -> Iterator[Swarm]:
    s = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=3,
                     timing={"health_interval": 1, "heartbeat_stale": 4, "max_attempts": 1})
    yield s
    s.teardown()


def events(swarm: Swarm, kind: str) -> list[dict]:
    return [e for e in swarm.events() if e["event"] == kind]


def test_the_swarm_comes_back_after_its_tmux_server_dies(swarm: Swarm) -> None:
    idents = swarm.import_plan(TASKS)
    swarm.script = {"*": "work:6"}
    swarm.write_script()
    swarm.start()
    wait_for(lambda: len(swarm.worker_windows()) == 3, 60, "three busy workers")
    swarm.tmux("kill-server")  # every window, the controller's and the workers', is gone
    wait_for(lambda: events(swarm, "session_created"), 30, "the session made again")
    wait_for(swarm.all_done, 240, "every issue Done after the tmux server died")
    wait_for(lambda: not swarm.workspaces(), 60, "every change merged")
    lost = events(swarm, "session_created")[-1]["lost_workers"]
    assert sorted(lost) == sorted(idents)
    # max_attempts = 1: a charged attempt would have held them; none was charged
    assert not events(swarm, "hold")
    respawns = [e for e in events(swarm, "spawn") if "no attempt charged" in e["reason"]]
    assert sorted(e["issue"] for e in respawns) == sorted(idents)
    assert sorted(swarm.trunk_files()) == sorted(
        {"README.md", *(f"changes/{i}.txt" for i in idents)})


def freeze(pid: int) -> Callable[[], None]:
    """Stop ``pid`` the way a hang does: ptrace-stopped, it neither runs nor handles
    SIGTERM, and tmux (which continues a pane's SIGSTOPped process) cannot wake it.
    Returns the thaw."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.ptrace(PTRACE_ATTACH, pid, 0, 0) == 0, os.strerror(ctypes.get_errno())

    def thaw() -> None:
        libc.ptrace(PTRACE_DETACH, pid, 0, 0)  # gone already: nothing to detach

    return thaw


PTRACE_ATTACH, PTRACE_DETACH = 16, 17


def test_a_frozen_controller_holding_the_lock_is_killed_and_replaced(swarm: Swarm) -> None:
    swarm.import_plan(TASKS)
    swarm.script = {"*": "work:2"}
    swarm.write_script()
    swarm.start()
    swarm.wait_first_tick()
    frozen = swarm.heartbeat()["pid"]
    thaw = freeze(frozen)  # alive, holding its lock, doing nothing, deaf to SIGTERM
    try:
        wait_for(lambda: events(swarm, "controller_killed"), 90, "the frozen controller killed")
        wait_for(swarm.all_done, 120, "every issue Done with a new controller")
    finally:
        thaw()
    assert events(swarm, "controller_killed")[0]["pid"] == frozen
    assert not events(swarm, "controller_crash_loop")
    started = [e["pid"] for e in events(swarm, "controller_started")]
    assert started[-1] != frozen


def test_a_failed_health_check_is_an_event_and_a_traceback(swarm: Swarm) -> None:
    """The daemon's log keeps the traceback; the event log says what failed."""
    swarm.start()
    wait_for(lambda: events(swarm, "controller_started"), 30, "a controller")
    restarts = swarm.state_dir / "controller-restarts.json"
    restarts.unlink(missing_ok=True)
    restarts.mkdir()  # the restart cannot be recorded: the health check fails
    # the controller says it started before its first tick writes the heartbeat
    swarm.wait_first_tick()
    beat = swarm.heartbeat()
    os.kill(beat["pid"], signal.SIGKILL)
    try:
        wait_for(lambda: events(swarm, "health_check_failed"), 30,
                 "the failed health check written as an event")
    finally:
        restarts.rmdir()
    failed = events(swarm, "health_check_failed")[0]
    assert "IsADirectoryError" in failed["error"] or "Errno" in failed["error"]
    log = swarm.state_dir / "logs" / "daemon.jsonl"
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    traced = [e for e in entries if e.get("event") == "health_check_failed"]
    assert traced and "Traceback" in traced[0]["exception"]


def test_logged_exceptions_carry_their_traceback(tmp_path: Path) -> None:
    target = tmp_path / "x.jsonl"
    logs.configure("INFO", json_file=target)
    try:
        try:
            raise ValueError("the cause")
        except ValueError:
            structlog.get_logger("t").exception("went_wrong", issue="DEMO-1")
        for handler in logging.getLogger().handlers:
            handler.flush()
        entry = json.loads(target.read_text().splitlines()[-1])
        assert entry["event"] == "went_wrong" and entry["issue"] == "DEMO-1"
        assert "Traceback" in entry["exception"] and "ValueError: the cause" in entry["exception"]
    finally:
        logging.getLogger().handlers[:] = []


def test_an_interrupted_repo_check_says_so_not_that_the_repo_is_gone(
        tmp_path: Path, jj_bin: str) -> None:
    repo = make_repo(jj_bin, tmp_path / "repo")
    killer = tmp_path / "jj"
    killer.write_text("#!/bin/sh\nkill -9 $$\n")
    killer.chmod(0o755)
    jj = JjRepository.open(repo, tmp_path / "ws", jj_bin=str(killer))
    with pytest.raises(JJInterrupted, match="interrupted") as interrupted:
        jj.trunk.check_repo()
    assert interrupted.value.retryable and "not a jj repository" not in str(interrupted.value)
    # the repo itself is fine
    JjRepository.open(repo, tmp_path / "ws", jj_bin=jj_bin).trunk.check_repo()
    assert subprocess.run([jj_bin, "root"], cwd=repo, capture_output=True).returncode == 0
