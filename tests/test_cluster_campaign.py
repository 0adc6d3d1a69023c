"""Issue 37 item 2, never two, measured: a swarm on a local Ray cluster of three worker
nodes, each with a HOME and XDG dirs of its own, while a seeded campaign of 2–4 faults
hits it: a node's raylet killed alone, a whole node killed, a worker's tmux server
killed on its host, the controller killed. After each node fault a fresh node joins,
as a cluster's autoscaler or Kubernetes would bring one.

Every demo agent holds an exclusive lock named after its issue for as long as it
lives (``RALPH_DEV_DEMO_LOCKS``), across every node on this machine: a second live
agent of one issue, at any moment, leaves ``ISSUE.TWICE``. The swarm must finish by
itself: every issue Done, merged exactly once, no second agent, nobody needed.
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
from typing import Any

import pytest
from ray_kit import hosts_dir, local_cluster
from swarm_kit import Swarm, wait_for

pytest.importorskip("ray", reason="ray is not installed (pip install 'ralph-dev[ray]')")

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("RALPH_DEV_CAMPAIGN_SEED", "20261128"))
FAULTS = ("raylet", "node", "tmux", "controller")
PLAN = "\n".join(f'[[task]]\nref = "t{n}"\ntitle = "Task {n}"\n' for n in range(1, 9))


@pytest.fixture
def campaign(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, jj_bin: str,
             tmux_socket: str) -> Iterator[tuple[Swarm, Any]]:
    base = tmp_path_factory.getbasetemp()
    with local_cluster(base, "demo", nodes=3, connect=False) as made:
        made.hosts = hosts_dir(base)
        swarm = Swarm.create(tmp_path / "swarm", jj_bin, tmux_socket, max_workers=4,
                             agent_seconds=6,
                             timing={"max_attempts": 8, "heartbeat_stale": 10,
                                     "crash_loop_restarts": 50})
        swarm.use_cluster(made.address, tmp_path / "remote.git")
        with swarm.config_file.open("a") as config:
            config.write("lease = 8\n")  # the [cluster] table is the config's last
        swarm.lock_agents()
        try:
            yield swarm, made
        finally:
            swarm.teardown()


def worker_nodes_in_use(swarm: Swarm) -> list[str]:
    """The nodes a live worker of the swarm runs on now."""
    return sorted({w["node"] for w in swarm.status()["workers"]
                   if w.get("node") and w["state"] == "running"})


def fresh_node(made: Any, index: int) -> None:
    """A new worker node in place of one lost, with dirs of its own."""
    from ralph_dev.core.cluster import SLOT_RESOURCE
    from ralph_dev.devtools.demo import node_env

    made.add_node(num_cpus=1, resources={SLOT_RESOURCE: 2},
                  env_vars=node_env(made.hosts, index, {k: v for k, v in os.environ.items()
                                                        if k == "RALPH_DEV_JJ"}))


def strike(swarm: Swarm, made: Any, fault: str, rng: random.Random, joined: list[int]
           ) -> str:
    """One fault, where a worker runs if any does; what was done."""
    busy = worker_nodes_in_use(swarm)
    nodes = [n for n in made.worker_nodes if n.node_id in busy] or list(made.worker_nodes)
    if fault in ("raylet", "node") and nodes:
        victim = rng.choice(nodes)
        if fault == "raylet":
            (raylet,) = victim.all_processes["raylet"]
            os.kill(raylet.process.pid, signal.SIGKILL)  # its workers' processes live on
            said = f"the raylet of node {victim.node_id[:8]}"
        else:
            made.remove_node(victim, allow_graceful=False)
            said = f"node {victim.node_id[:8]} whole"
        joined.append(joined[-1] + 1)
        fresh_node(made, joined[-1])
        return said
    if fault == "tmux":
        sockets = Path(os.environ.get("TMUX_TMPDIR", "/tmp"), f"tmux-{os.getuid()}")
        servers = sorted(s for s in sockets.glob(f"ralph-{swarm.project}-DEMO-*"))
        if servers:
            victim_socket = rng.choice(servers)
            subprocess.run(["tmux", "-L", victim_socket.name, "kill-server"],
                           capture_output=True, check=False)
            return f"the tmux server {victim_socket.name}"
        return "tmux: no worker's server right then"
    panes = swarm.tmux("list-panes", "-a", "-F", "#{window_name} #{pane_pid}").stdout.split()
    pids = dict(zip(panes[::2], panes[1::2], strict=False))
    if "controller" in pids:
        os.kill(int(pids["controller"]), signal.SIGKILL)
        return f"the controller {pids['controller']}"
    return "controller: none running right then"


def test_a_fault_campaign_on_three_nodes_never_runs_two_agents_of_one_issue(
        campaign: tuple[Swarm, Any]) -> None:
    swarm, made = campaign
    rng = random.Random(SEED)
    idents = swarm.import_plan(PLAN)
    swarm.start()
    wait_for(lambda: len(worker_nodes_in_use(swarm)) >= 2, 120, "workers on two nodes")
    struck, joined = [], [3]
    for fault in rng.sample(FAULTS, rng.randint(2, 4)):
        struck.append(strike(swarm, made, fault, rng, joined))
        time.sleep(rng.uniform(3.0, 8.0))  # the faults come apart, as a campaign's do
    print(f"\ncampaign seed {SEED}: " + "; ".join(struck))
    try:
        wait_for(swarm.all_done, 420, "every issue Done after the faults")
        wait_for(lambda: not swarm.workspaces(), 120, "every change merged")
    except AssertionError:
        tail = "\n".join(json.dumps(e)[:300] for e in swarm.events()[-60:])
        raise AssertionError(f"seed {SEED}, faults: {struck}\n{tail}") from None
    locks = swarm.lock_agents()
    # every agent took its issue's lock (the check ran), and none found it taken
    assert {p.stem for p in locks.glob("*.lock")} == set(idents)
    assert not list(locks.glob("*.TWICE")), f"two agents of one issue ({SEED}: {struck})"
    holds = [e for e in swarm.events() if e["event"] == "hold"]
    assert not holds, f"a person was needed: {holds} ({SEED}: {struck})"
    trunk = swarm.jj_out("log", "-r", "::main", "--no-graph", "-T", 'description ++ "\\n"')
    for ident in idents:  # nothing pushed was lost, nothing landed twice
        assert sum(line.startswith(f"{ident}:") for line in trunk.splitlines()) == 1, \
            (ident, trunk, struck)
