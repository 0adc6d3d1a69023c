"""Issue 37 item 3, hosts on demand: when ready issues wait for cluster slots, Ray's
autoscaler is asked for room for them (``ray.autoscaler.sdk.request_resources``), and
the request is withdrawn once nothing waits. Real parts: a Ray head whose autoscaler
starts and stops nodes on this machine with Ray's own fake multi-node provider
(``ray_kit.autoscaling_cluster``), the real plane, and the real controller."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import retry_until
from ray_kit import autoscaling_cluster, hosts_dir

pytest.importorskip("ray", reason="ray is not installed (pip install 'ralph-dev[ray]')")

pytestmark = pytest.mark.slow


def slot_nodes(plane: Any) -> list[int]:
    return sorted(node.slots for node in plane.nodes())


def test_asking_for_slots_starts_hosts_and_withdrawing_lets_them_go(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    from ralph_dev.hosts.ray.plane import RayPlane

    base = tmp_path_factory.getbasetemp()
    with autoscaling_cluster(base, hosts_dir(base)) as address:
        plane = RayPlane("demo", address=address, remote=str(tmp_path / "remote.git"))
        try:
            assert slot_nodes(plane) == [] and plane.free_slots() == 0  # no host yet
            assert plane.want_slots(3) is True
            retry_until(lambda: sum(slot_nodes(plane)) >= 3, 120, 0.5,
                        what="the autoscaler to start hosts for 3 slots")
            assert slot_nodes(plane) == [2, 2]  # hosts of 2 slots: two of them
            assert plane.want_slots(3) is False  # the same request is not made again
            assert plane.want_slots(0) is True
            retry_until(lambda: slot_nodes(plane) == [], 120, 0.5,
                        what="the idle hosts to go once the request is withdrawn")
        finally:
            plane.close()


def test_a_backlog_larger_than_the_clusters_slots_makes_the_autoscaler_start_hosts(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, jj_bin: str,
        tmux_socket: str) -> None:
    """The issue's check: a swarm on a cluster with no worker host at first and four
    ready issues; its controller asks for room, the autoscaler starts hosts (capped by
    ``cluster.max_hosts``), every issue ends Done on them, and once nothing waits the
    request is withdrawn and the idle hosts go."""
    from swarm_kit import Swarm, wait_for

    from ralph_dev.hosts.ray.plane import RayPlane

    base = tmp_path_factory.getbasetemp()
    with autoscaling_cluster(base, hosts_dir(base)) as address:
        swarm = Swarm.create(tmp_path / "swarm", jj_bin, tmux_socket, max_workers=4,
                             agent_seconds=2)
        swarm.use_cluster(address, tmp_path / "remote.git")
        with swarm.config_file.open("a") as config:
            config.write("max_hosts = 1\n")  # the [cluster] table is the config's last
        plane = RayPlane("watch", address=address, remote=str(tmp_path / "remote.git"))
        try:
            swarm.import_plan("\n".join(f'[[task]]\ntitle = "Task {n}"\n'
                                        for n in range(1, 5)))
            swarm.start()
            wait_for(lambda: slot_nodes(plane) == [2], 120, "a host started for the backlog")
            wait_for(lambda: "no more hosts are asked for (cluster.max_hosts = 1)" in
                     (swarm.state_dir / "waits.json").read_text(), 60,
                     "the waiting issues saying why no second host is asked for")
            wait_for(swarm.all_done, 300, "every issue Done on the hosts the autoscaler made")
            assert max(len(slot_nodes(plane)) for _ in range(3)) <= 1  # never over max_hosts
            asked = [e["slots"] for e in swarm.events() if e["event"] == "cluster_slots_asked"]
            # room for one slot while no host says its size, one host's, then none
            assert max(asked) == 2 and asked[-1] == 0, asked
            wait_for(lambda: slot_nodes(plane) == [], 120, "the idle host to go")
        finally:
            plane.close()
            swarm.teardown()
