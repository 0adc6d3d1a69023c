"""Issue 26, as a person runs it: a swarm whose workers Ray places on the hosts of a
cluster (a head and two worker nodes on this machine), the remote a bare git
repository, the scripted agent. One worker node is removed while issues run: every
issue ends Done and merged once, workers ran on both nodes, no issue ever had two live
agents, and the lost node's issue starts again on the other node.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray_kit import bare_remote, local_cluster
from swarm_kit import Swarm, wait_for

pytest.importorskip("ray", reason="ray is not installed (pip install 'ralph-dev[ray]')")

pytestmark = pytest.mark.slow

PLAN = "\n".join(f'[[task]]\nref = "t{n}"\ntitle = "Task {n}"\npriority = {1 + n % 3}\n'
                 for n in range(1, 7))


@pytest.fixture
def cluster_swarm(tmp_path: Path, jj_bin: str, tmux_socket: str
                  ) -> Iterator[tuple[Swarm, Any]]:
    with local_cluster(tmp_path, "demo", connect=False) as made:
        swarm = Swarm.create(tmp_path / "swarm", jj_bin, tmux_socket, max_workers=4,
                             agent_seconds=6, timing={"max_attempts": 4})
        remote = bare_remote(tmp_path / "remote.git")
        subprocess.run(["git", "-C", str(swarm.repo), "remote", "add", "origin", str(remote)],
                       check=True)
        with swarm.config_file.open("a") as config:
            config.write(f'\n[projects.{swarm.project}.cluster]\naddress = "{made.address}"\n'
                         "snapshot_interval = 2\n")
        locks = swarm.shared / "locks"
        locks.mkdir()
        swarm.env["RALPH_DEV_DEMO_LOCKS"] = str(locks)
        try:
            yield swarm, made
        finally:
            swarm.teardown()


def spawns(swarm: Swarm) -> list[dict[str, Any]]:
    return [e for e in swarm.events() if e["event"] in ("spawn", "restart")]


def test_a_swarm_on_three_nodes_loses_one_and_still_merges_everything_once(
        cluster_swarm: tuple[Swarm, Any]) -> None:
    swarm, made = cluster_swarm
    idents = swarm.import_plan(PLAN)
    swarm.start()

    def on_both_nodes() -> dict[str, str] | None:
        running = {e["node"]: e["issue"] for e in spawns(swarm) if e.get("node")}
        return running if len(running) == 2 else None

    placed = wait_for(on_both_nodes, 120, "workers started on both worker nodes")
    assert isinstance(placed, dict)
    def status_names_nodes() -> dict[str, Any] | None:
        doc = swarm.status()
        return doc if {w["node"] for w in doc["workers"]} & set(placed) else None

    shown = wait_for(status_names_nodes, 30, "status naming the workers' nodes")
    assert isinstance(shown, dict) and shown["cluster"]["free_slots"] is not None
    assert all(w["host"] for w in shown["workers"] if w["node"])
    lost_node, lost_issue = sorted(placed.items())[0]
    [doomed] = [n for n in made.worker_nodes if n.node_id == lost_node]
    made.remove_node(doomed, allow_graceful=False)

    try:
        wait_for(swarm.all_done, 300, "every issue Done after a node was lost")
        wait_for(lambda: not swarm.workspaces(), 120, "every change merged")
    except AssertionError:
        tail = "\n".join(json.dumps(e)[:300] for e in swarm.events()[-60:])
        raise AssertionError(f"lost node {lost_node[:12]} running {lost_issue}\n{tail}") \
            from None
    events = swarm.events()
    assert not list((swarm.shared / "locks").glob("*.TWICE")), "two agents on one issue"
    assert not [e for e in events if e["event"] == "hold"], "a person was needed"
    trunk = swarm.jj_out("log", "-r", "::main", "--no-graph", "-T", 'description ++ "\\n"')
    for ident in idents:  # merged exactly once each
        assert sum(line.startswith(f"{ident}:") for line in trunk.splitlines()) == 1, \
            (ident, trunk)
    # the lost node's issue started again on the node that is left, as a new attempt
    # that charged nothing, and nothing started on the lost node after it was gone
    again = [e for e in spawns(swarm) if e["issue"] == lost_issue]
    assert len(again) >= 2, again
    assert again[-1]["node"] != lost_node
    assert again[-1]["cluster_attempt"] > again[0]["cluster_attempt"]
    assert "no attempt charged" in again[-1]["reason"], again[-1]
    assert [e["node"] for e in spawns(swarm)].count(lost_node) <= 2
    assert {e["issue"] for e in events if e["event"] == "cluster_work_fetched"} == set(idents)
