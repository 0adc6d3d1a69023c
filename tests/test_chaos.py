"""Chaos: a 12-issue plan while seeded random kills hit the daemon, the controller, an
agent, a jj child of the controller and the tmux server.

The swarm must finish by itself: every issue Done, every change in trunk exactly
once, never two agents on one issue (each demo agent holds a lock named after
its issue), and nobody asked for help (no hold).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from swarm_kit import TWELVE_ISSUE_PLAN, Swarm, wait_for

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("RALPH_DEV_CHAOS_SEED", "20261123"))
KILLS = 5
TARGETS = ("daemon", "controller", "agent", "jj", "tmux")


@pytest.fixture
def swarm(tmp_path: Path, jj_bin: str, tmux_socket: str) -> Iterator[Swarm]:
    s = Swarm.create(tmp_path / "swarm", jj_bin, tmux_socket, max_workers=3,
                     agent_seconds=3,
                     timing={"health_interval": 1, "heartbeat_stale": 6, "max_attempts": 8,
                             "crash_loop_restarts": 50})
    s.lock_agents()
    yield s
    s.teardown()


def state_dir(swarm: Swarm) -> Path:
    return swarm.state_dir


def pane_pids(swarm: Swarm) -> dict[str, int]:
    out = swarm.tmux("list-panes", "-a", "-F", "#{window_name} #{pane_pid} #{pane_dead}")
    pids = {}
    for line in out.stdout.splitlines():
        name, pid, dead = line.split()
        if dead == "0":
            pids[name] = int(pid)
    return pids


def jj_children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=,comm=", "--ppid", str(pid)], capture_output=True,
                         text=True, check=False).stdout
    return [int(line.split()[0]) for line in out.splitlines() if line.split()[-1] == "jj"]


def killed(pid: int) -> bool:
    """SIGKILL ``pid``; False when it had already ended (it was listed a moment ago)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def strike(swarm: Swarm, target: str, rng: random.Random) -> str:
    """Kill one thing; say what was killed (or why nothing could be)."""
    panes = pane_pids(swarm)
    if target == "daemon":
        pid = swarm.daemon_pid()
        if not pid or not killed(pid):
            return "daemon: none running"
        wait_for(lambda: subprocess.run(["kill", "-0", str(pid)], capture_output=True)
                 .returncode != 0, 10, "the daemon gone")
        swarm.start()  # what systemd's Restart=always does
        return f"daemon {pid} (restarted)"
    if target == "controller" and "controller" in panes and killed(panes["controller"]):
        return f"controller {panes['controller']}"
    if target == "agent":
        workers = sorted(name for name in panes if name.startswith("DEMO-"))
        if workers:
            victim = rng.choice(workers)
            if killed(panes[victim]):
                return f"agent of {victim}"
    if target == "jj" and "controller" in panes:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # jj runs briefly: catch one in the act
            children = jj_children(panes["controller"])
            if children and killed(children[0]):
                return f"jj child {children[0]} of the controller"
            time.sleep(0.01)
    if target == "tmux":
        swarm.tmux("kill-server")
        return "the tmux server"
    return f"{target}: nothing to kill right then"


def test_the_swarm_survives_random_kills_without_a_person(swarm: Swarm) -> None:
    rng = random.Random(SEED)
    idents = swarm.import_plan(TWELVE_ISSUE_PLAN)
    swarm.start()
    struck = []
    for _ in range(KILLS):
        time.sleep(rng.uniform(2.0, 5.0))
        struck.append(strike(swarm, rng.choice(TARGETS), rng))
    print(f"\nchaos seed {SEED}: " + "; ".join(struck))
    try:
        wait_for(swarm.all_done, 300, "every issue Done after the kills")
        wait_for(lambda: not swarm.workspaces(), 120, "every change merged")
    except AssertionError:
        events = [json.dumps(e)[:200] for e in swarm.events()[-40:]]
        raise AssertionError(f"seed {SEED}, kills: {struck}\n" + "\n".join(events)) from None
    locks = swarm.lock_agents()
    assert not list(locks.glob("*.TWICE")), f"two agents on one issue (seed {SEED}: {struck})"
    holds = [e for e in swarm.events() if e["event"] == "hold"]
    assert not holds, f"a person was needed: {holds} (seed {SEED}: {struck})"
    trunk = swarm.jj_out("log", "-r", "::main", "--no-graph", "-T", 'description ++ "\\n"')
    for ident in idents:
        count = sum(line.startswith(f"{ident}:") for line in trunk.splitlines())
        issue = swarm.issue(ident)
        expected = 0 if issue["children"] else 1  # phases have no change of their own
        assert count == expected, (ident, count, f"seed {SEED}: {struck}")
