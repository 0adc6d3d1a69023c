"""A real Ray cluster on this machine for the tests (``ray.cluster_utils.Cluster``): a
head with no worker slots and nodes with ``ralph_worker`` slots, one cluster at a time
across the suite's xdist processes, torn down with every process it started checked
gone. Imported only by modules that skip without Ray."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conftest import retry_until, running

NAMESPACE = "ralph-dev-test"


def _cluster_pids(ray_cluster: Any) -> list[int]:
    nodes = [ray_cluster.head_node, *ray_cluster.worker_nodes]
    return [info.process.pid for node in nodes for infos in node.all_processes.values()
            for info in infos if info.process is not None]


@contextlib.contextmanager
def one_cluster_at_a_time(base: Path) -> Iterator[None]:
    """One cluster at a time (``base``: pytest's ``getbasetemp()``). The suite runs on
    several xdist processes, and each that takes a cluster test starts a cluster of its
    own: three clusters of three Ray nodes each would fight for the machine's cores
    while other tests run."""
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with (shared / "ray-cluster.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def local_cluster(base: Path, project: str, *, nodes: int = 2, slots: int = 2,
                  connect: bool = True) -> Iterator[Any]:
    """A head (no slots) and ``nodes`` nodes of ``slots`` worker slots each, each with
    a HOME and XDG dirs of its own under :func:`hosts_dir` (a real host shares none of
    the controller's; never the person's own); the test process
    connected to it unless ``connect`` is False (a controller of its own connects
    instead)."""
    import ray

    from ralph_dev.devtools.demo import local_cluster as started_cluster

    with one_cluster_at_a_time(base), started_cluster(
            nodes, slots, hosts_dir(base), {k: v for k, v in os.environ.items()
                                            if k == "RALPH_DEV_JJ"}) as made:
        if connect:
            ray.init(address=made.address, namespace=NAMESPACE, log_to_driver=False,
                     logging_level="WARNING")
        pids = _cluster_pids(made)
        try:
            yield made
        finally:
            if connect:
                ray.shutdown()
            kill_worker_servers(project)
    retry_until(lambda: not any(running(pid) for pid in pids), timeout=30,
                what="every raylet and GCS of the test cluster to exit")


def hosts_dir(base: Path) -> Path:
    """Where the test clusters' nodes have their HOME and XDG dirs (``nodeN/``)."""
    return base / "ray-hosts"


def hosts_data(base: Path) -> list[Path]:
    """Each node's ralph-dev data directory (its clones, workspaces and runs)."""
    return sorted(hosts_dir(base).glob("node*/data/ralph-dev"))


def kill_worker_servers(project: str) -> None:
    """A project's workers' tmux servers on this machine (a leftover of a node that was
    removed ends with its actor; this is the teardown's belt and braces)."""
    sockets = Path(os.environ.get("TMUX_TMPDIR", "/tmp"), f"tmux-{os.getuid()}")
    for socket in sockets.glob(f"ralph-{project}-*"):
        subprocess.run(["tmux", "-L", socket.name, "kill-server"], capture_output=True,
                       check=False)
        socket.unlink(missing_ok=True)


def bare_remote(path: Path) -> Path:
    """An empty bare git repository: the remote every host fetches from and pushes to."""
    subprocess.run(["git", "init", "-q", "--bare", str(path)], check=True)
    return path


HOST_TYPE = "ralph.host"
"""The one worker node type the test autoscaler starts: 1 CPU and 2 worker slots."""


@contextlib.contextmanager
def autoscaling_cluster(base: Path, hosts: Path, *, max_hosts: int = 3) -> Iterator[str]:
    """A head (no slots) whose autoscaler starts and stops nodes on this machine with
    Ray's own fake multi-node provider, each node of :data:`HOST_TYPE`; yields the
    head's address. Started by ``ray start --head`` in a session of its own and ended by
    killing that session's process group: ``ray stop`` (what Ray's own
    ``AutoscalingCluster`` uses) would end every Ray process on the machine. The nodes
    run with a HOME and XDG dirs under ``hosts`` (``node1/``), not the controller's."""
    import json
    import signal
    import sys
    import tempfile

    from ralph_dev.core.cluster import SLOT_RESOURCE
    from ralph_dev.devtools.demo import node_env

    with one_cluster_at_a_time(base):
        port, client_port, agent_port = _free_ports(3)
        # short: Ray's session sockets live under it, and a socket path has 107 bytes
        temp = Path(tempfile.mkdtemp(prefix="rda-"))
        config = temp / "autoscaler.json"
        config.write_text(json.dumps({
            "cluster_name": "ralph-test", "max_workers": max_hosts,
            "provider": {"type": "fake_multinode", "use_node_id_as_ip": True,
                         "disable_node_updaters": True, "disable_launch_config_check": True,
                         "gcs_address": f"127.0.0.1:{port}"},
            "available_node_types": {
                "ray.head.default": {"resources": {"CPU": 0}, "node_config": {},
                                     "max_workers": 0},
                HOST_TYPE: {"resources": {"CPU": 1, SLOT_RESOURCE: 2}, "node_config": {},
                            "min_workers": 0, "max_workers": max_hosts}},
            "head_node_type": "ray.head.default", "auth": {}, "upscaling_speed": 1.0,
            "idle_timeout_minutes": 0.05, "docker": {}, "initialization_commands": [],
            "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
            "head_start_ray_commands": [], "worker_start_ray_commands": [],
            "file_mounts": {}, "cluster_synced_files": [],
            "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": []}))
        env = {**os.environ, **node_env(hosts, 1, os.environ), "RAY_FAKE_CLUSTER": "1",
               "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
        head = subprocess.Popen(
            [str(Path(sys.executable).parent / "ray"), "start", "--head", f"--port={port}",
             "--num-cpus=0", f"--autoscaling-config={config}", f"--temp-dir={temp}",
             "--include-dashboard=false", "--disable-usage-stats",
             f"--ray-client-server-port={client_port}",
             # its own: another Ray on the machine may hold the default (52365)
             f"--dashboard-agent-listen-port={agent_port}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True)
        try:
            said, _ = head.communicate(timeout=120)
            assert head.returncode == 0, said.decode(errors="replace")[-3000:]
            yield f"127.0.0.1:{port}"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(head.pid, signal.SIGKILL)
            retry_until(lambda: not _in_group(head.pid), timeout=30,
                        what="every process of the autoscaling cluster to exit")
            subprocess.run(["rm", "-rf", str(temp)], check=False)


def _free_ports(count: int) -> list[int]:
    import socket

    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def _in_group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                fields = stat.rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    found.append(int(entry.name))
    return found
