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
