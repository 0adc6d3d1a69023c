"""Scheduling efficiency and memory: a 40-issue DAG, fixed-duration scripted
agents, concurrency 4, a 1 s tick, on the real daemon/controller/tmux/jj.

Prints makespan / lower bound (the larger of the critical path and total
work / concurrency) and the daemon's and controller's peak RSS.

``--nodes 0,1,2`` runs the same swarm once per node count, on this host's tmux (0) or
on a Ray cluster of that many nodes on this machine, the same total of worker slots
split over the nodes (``--workers`` slots in all), and prints each makespan: what
placing workers on hosts costs against one host. Measured on this machine (2 cores,
``--issues 12 --duration 5 --workers 4``, launch files and reports relayed): this
host 20.7 s, a cluster of 1 node 30.7 s, of 2 nodes 28.2 s, against a lower bound of
15 s (before the relay: 20.3, 28.8 and 30.2 s). Two nodes cost about what one
does; the cluster's cost is per worker: placing it (~0.6 s, ``cluster_plane.py``), its
final push, and the fetch and bring-in before its merge (~0.5 s).

    python benchmarks/scheduling.py [--issues 40] [--duration 20] [--workers 4] [--tick 1]
    python benchmarks/scheduling.py --issues 12 --duration 5 --nodes 0,1,2
"""

from __future__ import annotations

import argparse
import contextlib
import random
import subprocess
import sys
import tempfile
import uuid
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from swarm_kit import Swarm, wait_for


def make_dag(n: int, seed: int = 7) -> tuple[str, dict[str, list[str]]]:
    """A random layered DAG; returns plan TOML and ref → blockers."""
    rng = random.Random(seed)
    deps: dict[str, list[str]] = {}
    lines = []
    for i in range(n):
        ref = f"t{i}"
        earlier = [f"t{j}" for j in range(max(0, i - 8), i)]
        blockers = rng.sample(earlier, k=min(len(earlier), rng.choice([0, 0, 1, 1, 2])))
        deps[ref] = blockers
        lines += ["[[task]]", f'ref = "{ref}"', f'title = "Task {i}"',
                  f"blocked_by = {blockers!r}".replace("'", '"'), ""]
    return "\n".join(lines), deps


def critical_path(deps: dict[str, list[str]]) -> int:
    depth: dict[str, int] = {}
    for ref in deps:  # refs are in topological order by construction
        depth[ref] = 1 + max((depth[b] for b in deps[ref]), default=0)
    return max(depth.values())


def peak_rss_mb(pid: int | None) -> float | None:
    if not pid:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--issues", type=int, default=40)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--tick", type=float, default=1.0)
    parser.add_argument("--keep-events", help="write the run's events (JSON lines) here")
    parser.add_argument("--nodes", help="comma-separated node counts of a Ray cluster on this "
                                        "machine to run on, e.g. 1,2 (default: this host)")
    args = parser.parse_args()
    if not args.nodes:
        run(args, nodes=0)
        return
    figures = {int(n): run(args, nodes=int(n)) for n in args.nodes.split(",")}
    print("\nnodes  slots/node  makespan")
    for nodes, makespan in figures.items():
        per_node = f"{-(-args.workers // nodes)}" if nodes else "(this host)"
        print(f"{nodes:>5}  {per_node:>11}  {makespan:8.1f}s")


def run(args: argparse.Namespace, nodes: int) -> float:
    """One swarm to the end, on this host (``nodes`` 0) or on a Ray cluster of ``nodes``
    nodes; prints its figures and returns its makespan."""
    from ralph_dev.adapters.jj_cli import find_jj

    jj_bin = find_jj()
    if jj_bin is None:
        raise SystemExit("jj not found: run scripts/setup.sh")
    plan, deps = make_dag(args.issues)
    with tempfile.TemporaryDirectory(prefix="ralph-sched-") as tmp, \
            contextlib.ExitStack() as stack:
        socket = f"ralph-sched-{uuid.uuid4().hex[:8]}"
        swarm = Swarm.create(Path(tmp), jj_bin, socket, max_workers=args.workers,
                             timing={"poll_interval": args.tick, "stall_timeout": 600,
                                     "restart_timeout": 600},
                             agent_seconds=args.duration)
        if nodes:
            from ralph_dev.devtools.demo import local_cluster

            address = stack.enter_context(local_cluster(nodes, -(-args.workers // nodes),
                                                        Path(tmp) / "hosts",
                                                        swarm.env)).address
            swarm.use_cluster(address, Path(tmp) / "remote.git", snapshot_interval=60)
        try:
            swarm.import_plan(plan)
            swarm.start()
            wait_for(swarm.all_done, timeout=args.issues * args.duration * 3 + 120,
                     what="all issues done", interval=1)
            daemon_rss = peak_rss_mb(swarm.daemon_pid())
            controller_pid = swarm.heartbeat().get("pid")
            controller_rss = peak_rss_mb(controller_pid)
            events = swarm.events()
            if args.keep_events:
                Path(args.keep_events).write_text(
                    "".join(__import__("json").dumps(e) + "\n" for e in events))
        finally:
            swarm.teardown()
            subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
    spawns = [datetime.fromisoformat(e["time"]) for e in events if e["event"] == "spawn"]
    merges = [datetime.fromisoformat(e["time"]) for e in events if e["event"] == "merge"]
    makespan = (max(merges) - min(spawns)).total_seconds() if merges and spawns else float("nan")
    bound = max(critical_path(deps) * args.duration, args.issues * args.duration / args.workers)
    where = f"a Ray cluster of {nodes} node(s)" if nodes else "this host"
    print(f"issues {args.issues}, duration {args.duration}s, workers {args.workers}, "
          f"tick {args.tick}s, critical path {critical_path(deps)} tasks, on {where}")
    print(f"makespan {makespan:.1f}s  lower bound {bound:.1f}s  ratio {makespan / bound:.3f}")
    done = {e["issue"]: datetime.fromisoformat(e["time"]) for e in events
            if e["event"] == "worker_done"}
    spawned = {e["issue"]: datetime.fromisoformat(e["time"]) for e in events
               if e["event"] == "spawn"}
    merged = {e["issue"]: datetime.fromisoformat(e["time"]) for e in events
              if e["event"] == "merge"}
    work = [(done[i] - spawned[i]).total_seconds() for i in done if i in spawned]
    wait = [(merged[i] - done[i]).total_seconds() for i in merged if i in done]
    if work and wait:
        busy = sum(work) / (makespan * args.workers)
        print(f"per task: spawn→done {sum(work) / len(work):.2f}s (agent works "
              f"{args.duration}s), done→merged {sum(wait) / len(wait):.2f}s; "
              f"workers busy {busy:.0%} of the makespan")
    blockers = {f"DEMO-{int(ref[1:]) + 1}": [f"DEMO-{int(b[1:]) + 1}" for b in bs]
                for ref, bs in deps.items()}
    unlock = [(spawned[i] - max(merged[b] for b in bs)).total_seconds()
              for i, bs in blockers.items() if bs and i in spawned and all(b in merged for b in bs)]
    if unlock:
        print(f"last blocker merged → dependent spawned: mean {sum(unlock) / len(unlock):.2f}s, "
              f"max {max(unlock):.2f}s")
    print(f"peak RSS: daemon {daemon_rss or float('nan'):.1f} MB, controller "
          f"{controller_rss or float('nan'):.1f} MB, together "
          f"{(daemon_rss or 0) + (controller_rss or 0):.1f} MB")
    return makespan


if __name__ == "__main__":
    main()
