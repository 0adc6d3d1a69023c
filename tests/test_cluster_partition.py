"""Issue 37, the cluster keeps every promise: a network cut between the controller and a
live node. The node runs in a network namespace of its own, joined to this machine by a
veth pair; the head, the other node and the controller's connection use this machine's
end of the pair. The cut takes the namespace's end down: every process on the node runs
on (its agents too), but nothing there reaches the head or the controller any more, and
nothing from here reaches it. Ray declares the node dead; the controller must not start
the issues' next attempts elsewhere until the agents on the cut node have stopped
themselves (``cluster.lease``: the node stops an attempt that heard nothing for ¾ of it,
the controller waits the whole lease and a margin from the last call that came back).

Every demo agent holds a lock named after its issue while it lives (a second live agent
of one issue leaves ``ISSUE.TWICE``), and the test looks at every demo agent on the
machine every half second while the node is cut: never two of one issue.

The cluster's GCS checks its nodes' health every second (Ray's default: a node cut off is
declared dead after ~65 s, long after any lease of a few seconds ran out, and the
controller's own wait never mattered): the controller learns of the cut well before the
lease runs out, the case its wait is for.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from ray_kit import (
    Netns,
    NetnsRefused,
    hosts_dir,
    local_cluster,
    netns_missing,
    network_namespace,
    node_inside,
    worker_log_lines,
)
from swarm_kit import Swarm, live_agents, wait_for

pytest.importorskip("ray", reason="ray is not installed (pip install 'ralph-dev[ray]')")

pytestmark = pytest.mark.slow

LEASE = 40.0
"""``cluster.lease``: long enough that the controller hears of the cut (Ray declares the
node dead within ~15 s here) and could place the next attempts while the agents on the cut
node still run (they stop at ¾ of it), which only the controller's wait prevents."""

HEALTH = {"health_check_period_ms": 1000, "health_check_timeout_ms": 2000,
          "health_check_failure_threshold": 5}
"""The GCS's look at its nodes: a node that does not answer five in a row is dead."""

PLAN = "\n".join(f'[[task]]\nref = "t{n}"\ntitle = "Task {n}"\n' for n in (1, 2))


@dataclass
class Watch:
    """What the test sees every half second while the node is cut, in seconds since the
    watch began: each demo agent's first and last sighting, any two agents of one issue
    alive at once, and the controller's first wait on each issue's lease."""

    swarm: Swarm
    started: float = field(default_factory=time.monotonic)
    twice: list[tuple[float, dict[str, set[int]]]] = field(default_factory=list)
    """Moments (seconds since the watch began) two agents of one issue lived."""
    last_seen: dict[int, float] = field(default_factory=dict)
    """Each agent process: the last moment it was seen alive."""
    first_seen: dict[int, float] = field(default_factory=dict)
    issue_of: dict[int, str] = field(default_factory=dict)
    lease_waits: dict[str, float] = field(default_factory=dict)
    """Each issue the controller waited on an attempt's lease for: first seen when."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def now(self) -> float:
        return time.monotonic() - self.started

    def look(self) -> None:
        at = self.now()
        agents = live_agents(self.swarm.lock_agents())
        for issue, pids in agents.items():
            for pid in pids:
                self.issue_of[pid] = issue
                self.first_seen.setdefault(pid, at)
                self.last_seen[pid] = at
        doubled = {issue: pids for issue, pids in agents.items() if len(pids) > 1}
        if doubled:
            self.twice.append((at, doubled))
        with contextlib.suppress(OSError, ValueError):
            waits = json.loads((self.swarm.state_dir / "waits.json").read_text())
            for issue, wait in waits.items():
                if isinstance(wait, dict) and wait.get("kind") == "lease":
                    self.lease_waits.setdefault(issue, at)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.look()

    def __enter__(self) -> Watch:
        self.look()
        self._thread = threading.Thread(target=self._run, name="watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


@pytest.fixture
def partition(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, jj_bin: str,
              tmux_socket: str) -> Iterator[tuple[Swarm, Any, Netns, str]]:
    """A swarm on a cluster whose one node with slots runs in a network namespace."""
    missing = netns_missing()
    if missing:
        pytest.skip(missing)
    base = tmp_path_factory.getbasetemp()
    with contextlib.ExitStack() as stack:
        try:
            netns = stack.enter_context(network_namespace())
        except NetnsRefused as exc:
            pytest.skip(f"this machine will not make a network namespace: {exc}")
        made = stack.enter_context(local_cluster(base, "demo", nodes=0, connect=False,
                                                 node_ip=netns.host_ip,
                                                 system_config=HEALTH))
        made.hosts = hosts_dir(base)
        node = stack.enter_context(node_inside(made, netns, made.hosts, 1, slots=2))
        # the first agents work until they are stopped; heartbeat_stale as swarm_kit's 10 s
        # had the daemon restart the first controller during its first spawn here
        swarm = Swarm.create(tmp_path / "swarm", jj_bin, tmux_socket, max_workers=2,
                             agent_seconds=600,
                             timing={"max_attempts": 8, "heartbeat_stale": 60})
        swarm.use_cluster(made.address, tmp_path / "remote.git")
        with swarm.config_file.open("a") as config:
            config.write(f"lease = {LEASE:g}\n")  # the [cluster] table is the config's last
        swarm.lock_agents()
        stack.callback(swarm.teardown)
        yield swarm, made, netns, node


def waited(swarm: Swarm, predicate: Callable[[], Any], timeout: float, what: str) -> None:
    """``wait_for``, with the swarm's last events told when it times out."""
    try:
        wait_for(predicate, timeout, what)
    except AssertionError as failed:
        tail = "\n".join(json.dumps(e)[:400] for e in swarm.events()[-40:])
        raise AssertionError(f"{failed}\n{tail}") from None


def running_on(swarm: Swarm, node: str) -> set[str]:
    """The issues whose worker runs on ``node`` now, as the controller says."""
    return {w["issue"] for w in swarm.status()["workers"]
            if w.get("node") == node and w["state"] == "running"}


def node_alive(made: Any, node: str) -> bool:
    return any(n["NodeID"] == node and n["Alive"] for n in made.global_state.node_table())


def test_a_node_cut_off_from_the_controller_stops_its_agents_before_their_next_attempts(
        partition: tuple[Swarm, Any, Netns, str]) -> None:
    from ralph_dev.core.cluster import SLOT_RESOURCE
    from ralph_dev.devtools.demo import node_env

    swarm, made, netns, cut_node = partition
    idents = swarm.import_plan(PLAN)
    locks = swarm.lock_agents()
    swarm.start()
    # the node in the namespace is the only one with slots: both first attempts run there
    waited(swarm, lambda: running_on(swarm, cut_node) == set(idents)
           and set(live_agents(locks)) >= set(idents), 180, "both agents on the node to cut")
    first = {issue: pids for issue, pids in live_agents(locks).items() if issue in idents}
    # where the next attempts go: a node on this machine's end of the pair
    made.add_node(num_cpus=1, resources={SLOT_RESOURCE: 2}, node_ip_address=netns.host_ip,
                  env_vars=node_env(made.hosts, 2, {k: v for k, v in os.environ.items()
                                                    if k == "RALPH_DEV_JJ"}))
    swarm.script = {"*": "work:2"}  # read at an agent's start: the next attempts are quick
    swarm.write_script()
    gcs_port = int(made.address.rpartition(":")[2])
    assert netns.connects(gcs_port), "the node cannot reach the head before the cut"
    # the attempts cut off (a first spawn may have found no slot and been tried again)
    cut_attempts = {e["issue"]: e["host_attempt"] for e in swarm.events()
                    if e["event"] in ("spawn", "restart") and e.get("host_attempt")}
    with Watch(swarm) as watch:
        netns.cut()
        assert not netns.connects(gcs_port, timeout=1), "the cut node still reaches the head"
        wait_for(lambda: not node_alive(made, cut_node), 90, "Ray to declare the cut node dead")
        dead_at = watch.now()

        def finished() -> bool:
            assert not watch.twice, f"two live agents of one issue: {watch.twice[:3]}"
            assert not list(locks.glob("*.TWICE")), \
                f"an agent found its issue's lock taken: {sorted(locks.glob('*.TWICE'))}"
            return swarm.all_done()

        waited(swarm, finished, 240, "every issue Done after the cut")
        waited(swarm, lambda: not swarm.workspaces(), 120, "every change merged")
    events = swarm.events()
    cut_pids = {p for ps in first.values() for p in ps}
    print(f"\nafter the cut (s): node dead {dead_at:.1f}; lease waits from "
          f"{watch.lease_waits}; cut agents last seen "
          f"{ {i: max(watch.last_seen.get(p, -1) for p in ps) for i, ps in first.items()} }; "
          f"next agents first seen "
          f"{ {watch.issue_of[p]: t for p, t in watch.first_seen.items() if p not in cut_pids} }")
    # the cut stopped no process: each first agent was alive when Ray declared its node
    # dead, and went (stopped by its node) only afterwards
    for issue, pids in first.items():
        assert max(watch.last_seen.get(p, -1.0) for p in pids) >= dead_at, \
            (issue, dead_at, watch.last_seen)
    # ... stopped by their node itself, its lease run out
    stopped = [set(line.split()) for line in worker_log_lines(made, "lease_expired")]
    for ident in idents:
        said = {f"issue={ident}", f"attempt={cut_attempts[ident]}"}
        assert any(said <= words for words in stopped), (ident, cut_attempts, stopped)
    # the controller knew the host lost while the lease ran, and waited it out
    assert set(watch.lease_waits) == set(idents), watch.lease_waits
    assert not watch.twice, watch.twice
    assert not list(locks.glob("*.TWICE"))
    # every agent took its issue's lock (the check ran)
    assert {p.stem for p in locks.glob("*.lock")} == set(idents)
    # each issue's next attempt started only after its first agent had gone
    for issue, pids in first.items():
        gone = max(watch.last_seen[p] for p in pids)
        later = {p: watch.first_seen[p] for p, i in watch.issue_of.items()
                 if i == issue and p not in pids}
        assert later and min(later.values()) > gone, (issue, gone, later)
    holds = [e for e in events if e["event"] == "hold"]
    assert not holds, f"a person was needed: {holds}"
    trunk = swarm.jj_out("log", "-r", "::main", "--no-graph", "-T", 'description ++ "\\n"')
    for ident in idents:  # nothing pushed was lost, nothing landed twice
        assert sum(line.startswith(f"{ident}:") for line in trunk.splitlines()) == 1, \
            (ident, trunk)
