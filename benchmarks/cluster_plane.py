"""Cluster plane cost: one spawn and one observe over Ray, against this host's tmux.

Both planes run the same trivial worker (``sleep 60``) through the same port
(a window's ``open_window`` and ``list_windows``):

* spawn: ``open_window`` until ``list_windows()`` shows the window alive with its
  command running. On Ray that is the whole attempt as the controller starts it:
  taking an actor kept warm on a node with a free ``ralph_worker`` slot and claiming
  the attempt for it (or, with ``--warm 0``, placing a new actor, whose process Ray
  starts then), fetching the project there unless the kept actor fetched the trunk
  the controller names already, making the attempt's workspace, sending its launch
  files (``ShippingPlane``), unpacking them and opening its mailbox there, starting
  its leashed tmux server and opening the window, then the polls that see ``sleep``
  running. Each round starts once the kept actors run, as a controller's ticks keep
  them. Locally it is one window on a private tmux socket.
* observe: one ``list_windows()`` call with N workers live (N = every slot full).

The Ray side is a real cluster on this machine (``ray.cluster_utils.Cluster``): a
head without slots and NODES worker nodes of SLOTS ``ralph_worker`` slots each, the
remote a bare git repository seeded with one commit on ``main``. Spawns beyond the
slot count run in rounds: a round's workers are killed, and their slots seen free,
before the next round starts (not counted).

    python benchmarks/cluster_plane.py [--spawns 8] [--observes 20]

p90 is nearest-rank (with 4 samples it is the largest).

Measured on this machine (2 cores, ray 2.60, ``--spawns 8 --observes 10``, 2026-11-29)::

    tmux (local)
      spawn: median 15 ms, p90 23 ms, max 23 ms (n=8)
    ray (2 nodes x 2 slots, 4 kept warm)
      cluster start (head + nodes, connected): 6099 ms
      spawn: median 177 ms, p90 356 ms, max 356 ms (n=8: 356, 273, 176, 323, 161, 166, 163, 178)
      observe, 4 live: median 17 ms, p90 21 ms, max 22 ms (n=10)
    ray (2 nodes x 2 slots, 0 kept warm: --warm 0)
      spawn: median 846 ms, p90 1116 ms, max 1116 ms (n=8)

(Before actors were kept warm, every spawn was the ``--warm 0`` one: 641 ms median in
the third session, 1.0-1.3 s on this machine since.)
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tick_cost import make_repo, setup_env

NAMESPACE = "ralph-dev-bench"
WORKER = ["sleep", "60"]
POLL = 0.02
"""Seconds between the polls that wait for a spawned worker's command to run."""
SPAWN_TIMEOUT = 180.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", type=int, default=8)
    parser.add_argument("--observes", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--slots", type=int, default=2, help="ralph_worker slots per node")
    parser.add_argument("--warm", type=int, default=None,
                        help="actors kept warm (cluster.warm; default: one per slot, and "
                             "each round starts once they run; 0: every spawn cold)")
    args = parser.parse_args()
    from ralph_dev.adapters import logs
    from ralph_dev.adapters.jj_cli import find_jj

    logs.configure("WARNING")
    jj_bin = find_jj()
    if jj_bin is None:
        raise SystemExit("jj not found: run scripts/setup.sh")
    project = f"b{uuid.uuid4().hex[:8]}"
    live = min(args.spawns, args.nodes * args.slots)
    with tempfile.TemporaryDirectory(prefix="ralph-cluster-") as tmp:
        root = Path(tmp)
        setup_env(root)  # before the cluster starts: its actors inherit it
        remote = seed_remote(root, jj_bin)
        local = bench_tmux(root, project, args.spawns, live, args.observes)
        ray_side = bench_ray(root, project, remote, args, live)
    report("tmux (local)", local, live)
    warm = args.nodes * args.slots if args.warm is None else args.warm
    report(f"ray ({args.nodes} nodes x {args.slots} slots, {warm} kept warm)", ray_side, live)


# -- the remote -------------------------------------------------------------------------


def seed_remote(root: Path, jj_bin: str) -> Path:
    """A bare git repository holding trunk ``main`` with one commit."""
    bare = root / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    seed = root / "seed"
    make_repo(seed, jj_bin)
    env = {**os.environ, "JJ_USER": "bench", "JJ_EMAIL": "bench@example.com"}
    for step in (["git", "remote", "add", "origin", str(bare)],
                 ["git", "push", "--remote", "origin", "--bookmark", "main"]):
        subprocess.run([jj_bin, *step], cwd=seed, env=env, check=True, capture_output=True)
    return bare


# -- measuring ----------------------------------------------------------------------------


def _running(plane: Any, name: str) -> bool:
    """Whether ``name``'s window is listed alive with the worker's command running (a
    cluster worker's pane shows ``env`` until ``env`` execs the command)."""
    return any(w.name == name and w.alive and WORKER[0] in w.command
               for w in plane.list_windows())


def spawn(plane: Any, name: str, environment: dict[str, str], cwd: Path) -> tuple[float, str]:
    """Milliseconds from ``open_window`` to the command seen running; the target."""
    t0 = time.perf_counter()
    window = plane.open_window(name, cwd=cwd, command=WORKER, environment=environment)
    deadline = time.monotonic() + SPAWN_TIMEOUT
    while not _running(plane, name):
        if time.monotonic() > deadline:
            raise SystemExit(f"{name}: not seen running after {SPAWN_TIMEOUT:.0f}s")
        time.sleep(POLL)
    return (time.perf_counter() - t0) * 1000, window.pane_id


def observe(plane: Any, live: int, times: int) -> list[float]:
    """Milliseconds per ``list_windows()`` call, each checked to see ``live`` workers."""
    samples = []
    for _ in range(times):
        t0 = time.perf_counter()
        windows = plane.list_windows()
        samples.append((time.perf_counter() - t0) * 1000)
        seen = [w for w in windows if w.alive and w.name.startswith("BENCH-")]
        if len(seen) != live:
            raise SystemExit(f"observe saw {len(seen)} live workers, not {live}")
    return samples


def run_plane(plane: Any, cwd: Path, spawns: int, live: int, observes: int,
              environment: Callable[[int], dict[str, str]],
              end_round: Callable[[list[str]], None]) -> dict[str, Any]:
    """``spawns`` spawns in rounds of ``live``; observes once the first round is full."""
    spawned: list[float] = []
    observed: list[float] = []
    targets: list[str] = []
    for i in range(1, spawns + 1):
        took, target = spawn(plane, f"BENCH-{i}", environment(i), cwd)
        spawned.append(took)
        targets.append(target)
        if len(targets) == live:
            if not observed:
                observed = observe(plane, live, observes)
            end_round(targets)
            targets = []
    end_round(targets)
    return {"spawn": spawned, "observe": observed}


# -- the planes ---------------------------------------------------------------------------


def bench_tmux(root: Path, project: str, spawns: int, live: int,
               observes: int) -> dict[str, Any]:
    from ralph_dev.adapters.tmux import Tmux

    tmux = Tmux(f"ralph-{project}", f"ralph-{project}-local")
    cwd = root / "local"
    cwd.mkdir()
    tmux.ensure_session(cwd, {"PATH": os.environ["PATH"]})

    def end_round(targets: list[str]) -> None:
        for target in targets:
            tmux.kill_window(target)

    try:
        return run_plane(tmux, cwd, spawns, live, observes,
                         lambda _: {"PATH": os.environ["PATH"]}, end_round)
    finally:
        tmux.kill_server()


def bench_ray(root: Path, project: str, remote: Path, args: argparse.Namespace,
              live: int) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    from ralph_dev.adapters.jj_cli import child_path
    from ralph_dev.core import cluster
    from ralph_dev.core.environment import ATTEMPT_VAR
    from ralph_dev.hosts.ray.plane import RayPlane

    started = time.perf_counter()
    made = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False})
    pids: list[int] = []
    plane: RayPlane | None = None
    everyone: list[str] = []
    try:
        for _ in range(args.nodes):
            made.add_node(num_cpus=1, resources={cluster.SLOT_RESOURCE: args.slots})
        ray.init(address=made.address, namespace=NAMESPACE, log_to_driver=False,
                 logging_level="WARNING")
        made.wait_for_nodes()
        cluster_start = time.perf_counter() - started
        pids = _cluster_pids(made)
        slots = args.nodes * args.slots
        warm = slots if args.warm is None else args.warm
        plane = RayPlane(project, address=made.address, remote=str(remote),
                         root=str(root / "hosts"), namespace=NAMESPACE, warm=warm)

        def environment(i: int) -> dict[str, str]:
            return {"PATH": child_path(), ATTEMPT_VAR: str(i)}

        def end_round(targets: list[str]) -> None:
            assert plane is not None
            for target in targets:
                plane.kill_window(target)
            # as the controller's ticks do: each asks the free slots, which keeps up to
            # `warm` actors started on them; the next round starts once they run
            deadline = time.monotonic() + 60
            while plane.free_slots() < slots or plane.warm_running() < min(warm, slots):
                if time.monotonic() > deadline:
                    raise SystemExit("the killed workers' slots were not freed in 60s")
                time.sleep(0.1)

        def tracked(i: int) -> dict[str, str]:
            everyone.append(cluster.actor_name(project, f"BENCH-{i}", i))
            return environment(i)

        end_round([])  # the first round too starts with the kept actors running
        shipping = ShippingPlane(plane, root / "controller", remote)
        result = run_plane(shipping, root, args.spawns, live, args.observes, tracked,
                           end_round)
        result["cluster_start"] = cluster_start * 1000
        return result
    finally:
        if plane is not None:
            for target in everyone:  # already gone is fine
                plane.kill_window(target)
            plane.close()  # the actors kept warm
        ray.shutdown()
        made.shutdown()
        _kill_worker_servers(project)
        deadline = time.monotonic() + 30
        while [p for p in pids if _alive(p)] and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [p for p in pids if _alive(p)]
        if left:
            print(f"warning: cluster processes still running: {left}", file=sys.stderr)


class ShippingPlane:
    """The controller's spawn on a cluster, as ``control.act`` makes it: place the
    attempt, send its launch files (a worker directory the size of a real one: agent
    settings, a sandbox filter, a 10 KB prompt; its run directory, whose mailbox the
    host then opens), open its window."""

    def __init__(self, plane: Any, controller: Path, remote: Path) -> None:
        self.plane = plane
        self.controller = controller
        self.trunk_commit = subprocess.run(
            ["git", "-C", str(remote), "rev-parse", "main"], check=True,
            capture_output=True, text=True).stdout.strip()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.plane, name)

    def open_window(self, name: str, *, cwd: Path, command: list[str],
                    environment: dict[str, str]) -> Any:
        from ralph_dev.core import cluster
        from ralph_dev.core.environment import ATTEMPT_VAR
        from ralph_dev.hosts.bundle import pack

        worker = self.controller / name
        for sub in ("home/.claude", "run/outbox", "run/answers", "tmp"):
            (worker / sub).mkdir(parents=True, exist_ok=True)
        (worker / "home/.claude/settings.json").write_text('{"hooks": {}}\n' * 40)
        (worker / "filter.bpf").write_bytes(os.urandom(4096))
        (worker / "prompt.md").write_text("x" * 10_240)
        attempt = int(environment[ATTEMPT_VAR])
        # as the controller does: it names the trunk commit it pushed for hosts
        self.plane.place(name, attempt, trunk_commit=self.trunk_commit)
        self.plane.attempt(cluster.actor_name(self.plane.project, name, attempt)).receive(
            pack({"worker": worker}, trees=[worker]))
        return self.plane.open_window(name, attempt, command=command, environment={
            **environment, "HOME": str(worker / "home"), "RALPH_DEV_RUN_DIR": str(worker / "run")})


def _cluster_pids(made: Any) -> list[int]:
    nodes = [made.head_node, *made.worker_nodes]
    return [info.process.pid for node in nodes for infos in node.all_processes.values()
            for info in infos if info.process is not None]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _kill_worker_servers(project: str) -> None:
    """Every tmux server named ``ralph-PROJECT-*`` left on this machine (a worker's is
    leashed to its actor, but a leftover must not outlive the benchmark)."""
    tmpdir = os.environ.get("TMUX_TMPDIR", "/tmp")  # noqa: S108 - where tmux puts sockets
    sockets = Path(tmpdir, f"tmux-{os.getuid()}")
    for socket in sockets.glob(f"ralph-{project}-*"):
        subprocess.run(["tmux", "-L", socket.name, "kill-server"], capture_output=True,
                       check=False)
        socket.unlink(missing_ok=True)


# -- the figures ----------------------------------------------------------------------------


def _p90(samples: list[float]) -> float:
    return sorted(samples)[math.ceil(len(samples) * 0.9) - 1]


def _line(what: str, samples: list[float], each: bool = False) -> str:
    listed = f": {', '.join(f'{s:.0f}' for s in samples)}" if each else ""
    return (f"  {what}: median {statistics.median(samples):.0f} ms, "
            f"p90 {_p90(samples):.0f} ms, max {max(samples):.0f} ms "
            f"(n={len(samples)}{listed})")


def report(plane: str, result: dict[str, Any], live: int) -> None:
    print(plane)
    if "cluster_start" in result:
        print(f"  cluster start (head + nodes, connected): {result['cluster_start']:.0f} ms")
    print(_line("spawn", result["spawn"], each=True))
    print(_line(f"observe, {live} live", result["observe"]))


if __name__ == "__main__":
    main()
