"""A real Ray cluster on this machine for the tests (``ray.cluster_utils.Cluster``): a
head with no worker slots and nodes with ``ralph_worker`` slots, one cluster at a time
across the suite's xdist processes, torn down with every process it started checked
gone. Imported only by modules that skip without Ray."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
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
                  connect: bool = True, node_ip: str | None = None,
                  system_config: dict[str, Any] | None = None) -> Iterator[Any]:
    """A head (no slots) and ``nodes`` nodes of ``slots`` worker slots each, each with
    a HOME and XDG dirs of its own under :func:`hosts_dir` (a real host shares none of
    the controller's; never the person's own); the test process
    connected to it unless ``connect`` is False (a controller of its own connects
    instead). ``node_ip``: the address of this machine the head and nodes say they are
    at (:class:`Netns`'s host side); ``system_config``: Ray's own settings."""
    import ray

    from ralph_dev.devtools.demo import local_cluster as started_cluster

    with one_cluster_at_a_time(base), started_cluster(
            nodes, slots, hosts_dir(base), {k: v for k, v in os.environ.items()
                                            if k == "RALPH_DEV_JJ"},
            node_ip=node_ip, system_config=system_config) as made:
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


# -- a node behind a network of its own: a real network cut -------------------------------

NETNS_SUBNET = "10.213"
"""The /16 the test namespaces' /30s are taken from (``10.213.N.0/30``)."""


class NetnsRefused(Exception):
    """This machine would not make a network namespace (``ip netns add``, a veth pair)."""


def netns_missing() -> str | None:
    """Why a test cannot put a node behind a network of its own on this machine (None:
    it can): a network namespace needs root, and iproute2's ``ip`` to make it."""
    if os.geteuid() != 0:
        return (f"needs root to make a network namespace and cut it off (running as uid "
                f"{os.geteuid()})")
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` to make a network namespace (apt-get install iproute2)"
    return None


@dataclass(frozen=True)
class Netns:
    """A network namespace joined to this machine by a veth pair, a /30 of its own:
    ``host_ip`` on this machine's end (``host_link``), ``ns_ip`` inside (``ns_link``)."""

    name: str
    host_link: str
    ns_link: str
    host_ip: str
    ns_ip: str

    def cut(self) -> None:
        """Cut the namespace off, as a network cut does a host: its end of the pair
        goes down, so nothing inside reaches this machine (no route) and nothing sent
        from here reaches inside (lost on the way: a caller's calls time out). Every
        process inside runs on, and still shares this machine's files."""
        _ip("-n", self.name, "link", "set", self.ns_link, "down", check=True)

    def pids(self) -> list[int]:
        """The processes inside."""
        return [int(p) for p in _ip("netns", "pids", self.name).stdout.split()]

    def connects(self, port: int, timeout: float = 3.0) -> bool:
        """Whether a TCP connection from inside to this machine's end, ``port``, opens."""
        probe = ("import socket, sys\ntry:\n"
                 f"    socket.create_connection(({self.host_ip!r}, {port}), timeout={timeout})"
                 "\nexcept OSError:\n    sys.exit(1)\n")
        return subprocess.run(["ip", "netns", "exec", self.name, sys.executable, "-c", probe],
                              capture_output=True, check=False,
                              timeout=timeout + 30).returncode == 0


def _ip(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetnsRefused(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


@contextlib.contextmanager
def network_namespace() -> Iterator[Netns]:
    """A :class:`Netns` for this process (named after its pid), removed at the end with
    every process inside, even when the test fails. Raises :class:`NetnsRefused` when
    the machine will not make one."""
    tag = f"rdt{os.getpid()}"
    third = os.getpid() % 250 + 3
    netns = Netns(name=tag, host_link=f"{tag}h", ns_link=f"{tag}n",
                  host_ip=f"{NETNS_SUBNET}.{third}.1", ns_ip=f"{NETNS_SUBNET}.{third}.2")
    for name in _ip("netns", "list").stdout.split():  # a run killed before its end left it
        if name == tag or (name.startswith("rdt") and name[3:].isdigit()
                           and not running(int(name[3:]))):
            _remove_netns(Netns(name=name, host_link=f"{name}h", ns_link=f"{name}n",
                                host_ip="", ns_ip=""))
    try:
        _ip("netns", "add", tag, check=True)
        _ip("link", "add", netns.host_link, "type", "veth", "peer", "name", netns.ns_link,
            check=True)
        _ip("link", "set", netns.ns_link, "netns", tag, check=True)
        _ip("addr", "add", f"{netns.host_ip}/30", "dev", netns.host_link, check=True)
        _ip("link", "set", netns.host_link, "up", check=True)
        _ip("-n", tag, "addr", "add", f"{netns.ns_ip}/30", "dev", netns.ns_link, check=True)
        _ip("-n", tag, "link", "set", netns.ns_link, "up", check=True)
        _ip("-n", tag, "link", "set", "lo", "up", check=True)
        yield netns
    finally:
        _remove_netns(netns)


def _remove_netns(netns: Netns) -> None:
    """Every process inside ended, the namespace and both ends of its pair gone."""
    import signal

    if Path("/run/netns", netns.name).exists():
        def nobody_inside() -> bool:
            for pid in netns.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return not netns.pids()

        retry_until(nobody_inside, timeout=30, interval=0.2,
                    what=f"every process in network namespace {netns.name} to end")
        _ip("netns", "del", netns.name)
    _ip("link", "del", netns.host_link)  # gone with the namespace, unless it never moved
    retry_until(lambda: _ip("link", "show", netns.host_link).returncode != 0, timeout=30,
                what=f"veth {netns.host_link} to go")


@contextlib.contextmanager
def node_inside(made: Any, netns: Netns, hosts: Path, index: int, *, slots: int = 2
                ) -> Iterator[str]:
    """A node of cluster ``made`` (whose head is at ``netns.host_ip``) started inside
    ``netns`` with ``ray start --block``, with ``slots`` worker slots and, like
    :func:`local_cluster`'s nodes, a HOME and XDG dirs of its own (``hosts/nodeN``);
    yields its Ray node id once the cluster lists it. Its processes are ended at the
    end (the namespace's end ends any left)."""
    import json
    import signal

    from ralph_dev.core.cluster import SLOT_RESOURCE
    from ralph_dev.devtools.demo import node_env

    env = {**os.environ, **node_env(hosts, index, os.environ)}
    said = hosts / f"node{index}.ray-start.log"
    with said.open("wb") as out:
        node = subprocess.Popen(
            ["ip", "netns", "exec", netns.name, str(Path(sys.executable).parent / "ray"),
             "start", f"--address={made.address}", f"--node-ip-address={netns.ns_ip}",
             f"--resources={json.dumps({SLOT_RESOURCE: slots})}", "--num-cpus=1",
             f"--object-store-memory={150 * 2**20}", "--disable-usage-stats", "--block"],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    try:
        def joined() -> str | None:
            if node.poll() is not None:
                raise AssertionError(f"ray start in {netns.name} exited {node.returncode}:\n"
                                     + said.read_text(errors="replace")[-3000:])
            return next((n["NodeID"] for n in made.global_state.node_table()
                         if n["Alive"] and n["NodeManagerAddress"] == netns.ns_ip), None)

        found = retry_until(joined, timeout=90, interval=0.5,
                            what=f"the node in {netns.name} to join the cluster")
        yield str(found)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)
        node.wait(timeout=30)


def worker_log_lines(made: Any, needle: str) -> list[str]:
    """The lines holding ``needle`` of every log of a Ray worker process of cluster
    ``made`` (its nodes on this machine share the head's session directory; a dead
    worker's log may have moved to ``logs/old``): what the attempts' actors said."""
    logs = Path(made.head_node.get_session_dir_path()) / "logs"
    return [line for path in sorted(logs.rglob("worker-*"))
            for line in path.read_text(errors="replace").splitlines() if needle in line]
