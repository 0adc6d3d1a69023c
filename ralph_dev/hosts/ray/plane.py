"""The process plane on a Ray cluster: each worker attempt an actor on some host.

With ``hosts.ray.warm``, the only module that imports Ray; ``control.loop.wiring``
imports it only for a project with a ``[cluster]`` table. ``hosts.ray.host`` makes it
the worker-host port: a window is named by its issue, and its target (pane and window
id) is its attempt, ``PROJECT:ISSUE#ATTEMPT``; each call to an attempt is a typed
method of :class:`AttemptCalls`.

Why these choices (checked with ray 2.60, notes/ray.md):

* Started before they are wanted (``hosts.ray.warm``): Ray starts a new process for
  each actor, most of a spawn's time, so a few are kept running on free slots and a
  spawn makes one of them its attempt. One attempt never runs twice: each is claimed
  once, put-if-absent, in Ray's key-value store, which names the actor running it; a
  controller restart finds its workers there. Detached, and named ``PROJECT:~ID``, so
  they outlive a controller and are listed by project.
* ``max_restarts=0``: Ray re-running the constructor elsewhere would be a second
  agent on the issue that the controller never decided on.
* One ``ralph_worker`` resource each: a host's slots are its own count, set where it
  joins (``ray start --resources``); the SPREAD strategy uses every host.
* An actor that does not answer in time is reported alive (it may be running: never
  start a second on a guess); one Ray says is dead or unreachable is reported dead,
  and its push is fenced by attempt (``core.cluster.mergeable_push``), since a host
  cut off by the network may still be running it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray._private import state as ray_state  # free slots per node
from ray.autoscaler.v2.sdk import get_cluster_status  # slots waited for
from ray.exceptions import RayError, RayTaskError
from ray.util import list_named_actors
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ralph_dev.adapters.git import git_remote_url
from ralph_dev.core import cluster
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import ConfigError, HostUnavailable, RalphError
from ralph_dev.core.model import NodeSlots, Placement, Window
from ralph_dev.hosts.bundle import Bundle
from ralph_dev.hosts.hooks import Hooks
from ralph_dev.hosts.node.worker import (
    AttemptRunning,
    NodeWorker,
    WorkerSpec,
    host_sandbox,
    host_tools,
)
from ralph_dev.hosts.ray.warm import IDLE_EXIT, Claims, WarmPool, is_kept_name, kept_name

NAMESPACE = "ralph-dev"
START_TIMEOUT = 180.0
"""Seconds for an attempt to be placed, clone or fetch, and open its window (a first
clone of a large project on a new host is the slow part)."""
PLACE_TIMEOUT = 20.0
"""Seconds for Ray to find a host with a free slot for an attempt: the controller places
only as many as it saw free, so waiting longer means the slot went elsewhere. A host that
took it but is still starting its process (slow under load: a new Python process per
attempt) is waited for up to ``START_TIMEOUT`` instead: giving up then and placing again
would only start the same slow start over."""
LIST_TIMEOUT = 5.0
"""Seconds a tick waits for its workers to say how their windows are: one that has not
answered by then counts as running (never start a second on a guess), and the tick goes
on (a lost node's calls fail in ~3 s, but may take longer)."""

LOST_NODE_HOLD = 60.0
"""Seconds a node a worker was lost on counts no free slots, unless Ray stops listing it
sooner (it declares a node whose raylet is gone dead within ~15 s): long enough to
bridge that, short enough that a node whose one actor failed is not left out for long."""

REACH_TIMEOUT = 5.0
"""Seconds to reach the cluster's address before connecting (Ray's own retries last
minutes)."""
CALL_TIMEOUT = 20.0
"""Seconds for any other call; a node that died fails its calls within ~3 s."""
ASK_TIMEOUT = 90.0
"""Seconds for a question asked on every node (``doctor``): each answer needs a Python
worker started on its node first, which a loaded host takes tens of seconds for."""


class ClusterError(HostUnavailable):
    """A cluster call failed; the next tick looks again."""


def check_reachable(address: str, timeout: float = REACH_TIMEOUT) -> None:
    """Raise unless something listens at a ``HOST:PORT`` or ``ray://HOST:PORT`` address:
    ``ray.init`` retries an unreachable one for minutes ("auto" finds this host's
    cluster file, or says at once there is none)."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except (OSError, ValueError) as exc:
        raise ClusterError(f"cannot reach the Ray cluster at {address} ({exc})") from None


def _this_node() -> Placement:
    """Runs on the host the actor was placed on."""
    return Placement(node=ray.get_runtime_context().get_node_id(), host=socket.gethostname())


_RemoteWorker: Any = ray.remote(NodeWorker)


@ray.remote(num_cpus=0)
def _tools_on(agent: str | None, sandboxed: bool
              ) -> tuple[str, dict[str, str | None], str | None]:
    return socket.gethostname(), host_tools(agent), host_sandbox() if sandboxed else None


@dataclass(frozen=True)
class HostReport:
    """One node as ``doctor`` shows it."""

    node: str
    host: str
    slots: int
    tools: Mapping[str, str | None]
    sandbox: str | None = None
    """Why this host cannot start a sandboxed worker, with the path and the fix (None:
    it can, or workers run unconfined)."""

    @property
    def missing(self) -> list[str]:
        return [name for name, where in self.tools.items() if where is None]


class AttemptCalls:
    """One attempt's actor (``hosts.node.worker.NodeWorker`` on its host), each of its
    calls a typed method: what a call sends and answers is checked here, not left to a
    method's name in a string."""

    def __init__(self, actor: Any, get: Callable[[Any], Any]) -> None:
        self._actor = actor
        self._get = get

    def where(self) -> Placement:
        placed: Placement = self._get(self._actor.where.remote())
        return placed

    def push(self) -> str:
        """The attempt's change pushed to the remote as ``ralph/ISSUE/aN``: the bookmark."""
        return str(self._get(self._actor.push.remote()))

    def send_text(self, text: str) -> None:
        self._get(self._actor.send_text.remote(text))

    def dismiss(self) -> None:
        self._get(self._actor.dismiss.remote())

    def capture(self, lines: int) -> str:
        return str(self._get(self._actor.capture.remote(lines)))

    def read_log(self, position: int, limit: int) -> tuple[bytes, int]:
        data, end = self._get(self._actor.read_log.remote(position, limit))
        return bytes(data), int(end)

    def read_ledger(self, position: int, limit: int) -> tuple[bytes, int]:
        data, end = self._get(self._actor.read_ledger.remote(position, limit))
        return bytes(data), int(end)

    def snapshot(self) -> list[str]:
        return list(self._get(self._actor.snapshot.remote()))

    def describe(self, message: str, require_change: bool) -> None:
        self._get(self._actor.describe.remote(message, require_change))

    def change_diff(self) -> str:
        return str(self._get(self._actor.change_diff.remote()))

    def conflicted_files(self) -> list[str]:
        return list(self._get(self._actor.conflicted_files.remote()))

    def receive(self, bundle: Bundle) -> None:
        self._get(self._actor.receive.remote(bundle))

    def exchange(self, files: dict[str, bytes], answers: dict[str, bytes], taken: list[str],
                 wait: float) -> dict[str, bytes]:
        got = self._get(self._actor.exchange.remote(files, answers, taken, wait))
        return {str(k): bytes(v) for k, v in dict(got).items()}

    def transcript(self, session: str) -> bytes | None:
        data = self._get(self._actor.transcript.remote(session))
        return None if data is None else bytes(data)


class RayPlane:
    """One project's workers on a Ray cluster."""

    def __init__(self, project: str, *, address: str, remote: str, trunk: str = "main",
                 root: str | None = None, snapshot_interval: float = 0.0,
                 lease: float = 0.0, namespace: str = NAMESPACE,
                 call_timeout: float = CALL_TIMEOUT, start_timeout: float = START_TIMEOUT,
                 place_timeout: float = PLACE_TIMEOUT, warm: int = 0,
                 autoscaled: bool = False) -> None:
        self.project = project
        self.address = address
        self.remote = remote
        self.trunk = trunk
        self.root = root
        self.snapshot_interval = snapshot_interval
        self.lease = lease
        """Each attempt's lease (``WorkerSpec.lease``): the carrier's calls renew it."""
        self.namespace = namespace
        self.call_timeout = call_timeout
        self.start_timeout = start_timeout
        self.place_timeout = place_timeout
        self._connected_here = False
        self._connecting = threading.Lock()
        self._node_of: dict[str, str] = {}
        """Each attempt's node (actor name → Ray node id), as it answered."""
        self._slots_asked: int | None = None
        """What Ray's autoscaler was last asked to make room for (``want_slots``)."""
        self.autoscaled = autoscaled
        """Ray's autoscaler may stop idle hosts (``cluster.max_hosts``): actors are kept
        warm only while it is asked for slots, so a host left idle is let go."""
        self._pool = WarmPool(self._make_kept, project, warm, place_timeout)
        self._claims = Claims(project)
        self._actor_of: dict[str, str] = {}
        """Each attempt's actor (``PROJECT:ISSUE#N`` → actor name), as claimed."""
        self._lost_nodes: dict[str, float] = {}
        """Nodes a worker was lost on (node id → until when, on this process's monotonic
        clock, its slots are not counted): Ray may count a lost node's slots for a while
        after its actors stopped answering, and a placement on them only waits."""

    @classmethod
    def from_settings(cls, settings: ProjectSettings) -> RayPlane:
        if settings.cluster is None:
            raise ConfigError(f"projects.{settings.name}.cluster: missing (no cluster)")
        remote = settings.cluster.remote or git_remote_url(settings.repo, settings.merge.remote)
        if remote is None:
            raise ConfigError(
                f"projects.{settings.name}.cluster.remote: missing, and {settings.repo} has "
                f"no git remote {settings.merge.remote!r}: name a git URL every host can "
                "fetch from and push to")
        # hosts start from what the controller pushed of trunk (``RayHost.make_workspace``)
        return cls(settings.name, address=settings.cluster.address, remote=remote,
                   trunk=cluster.BASE_BOOKMARK,
                   snapshot_interval=settings.cluster.snapshot_interval,
                   lease=settings.cluster.lease, warm=settings.cluster.warm,
                   autoscaled=settings.cluster.max_hosts is not None)

    def _connect(self) -> None:
        # the tick's look, the actuator and the carrier's threads all start here: one
        # connects, the others wait for it (Ray refuses a second `ray.init`)
        with self._connecting:
            if not ray.is_initialized():
                check_reachable(self.address)
                ray.init(address=self.address, namespace=self.namespace,
                         log_to_driver=False, logging_level=logging.WARNING)
                self._connected_here = True

    def _get(self, ref: Any, timeout: float | None = None) -> Any:
        try:
            return ray.get(ref, timeout=self.call_timeout if timeout is None else timeout)
        except RayTaskError as exc:  # the worker's own answer (a refused `worker done`)
            if isinstance(exc.cause, RalphError):
                raise exc.cause from None
            raise ClusterError(f"the cluster did not answer: {exc}") from exc
        except RayError as exc:
            raise ClusterError(f"the cluster did not answer: {exc}") from exc

    def _actor(self, target: str) -> Any:
        self._connect()
        actor = self._running(target)
        if actor is None:
            raise ClusterError(f"{target}: no such worker on the cluster")
        return actor

    def _running(self, target: str) -> Any:
        """The actor running attempt ``target``, as claimed; None once it has ended (its
        claim is released then). An attempt started by a controller before attempts
        were claimed runs under its own name."""
        name = self._actor_of.get(target) or self._claims.holder(target)
        if name is None:
            with contextlib.suppress(ValueError):
                return ray.get_actor(target, namespace=self.namespace)
            return None
        try:
            actor = ray.get_actor(name, namespace=self.namespace)
        except ValueError:
            self._released(target)
            return None
        self._actor_of[target] = name
        return actor

    def _released(self, target: str) -> None:
        self._actor_of.pop(target, None)
        self._node_of.pop(target, None)
        with contextlib.suppress(RayError):
            self._claims.release(target)

    def attempt(self, target: str) -> AttemptCalls:
        """The attempt's actor, asked through its typed calls."""
        return AttemptCalls(self._actor(target), self._get)

    # -- the port ---------------------------------------------------------------------------

    def place(self, name: str, attempt: int, *, rebase: bool = False,
              hooks: Hooks | None = None, trunk_commit: str | None = None) -> Path:
        """Place attempt ``attempt`` of issue ``name`` on a host with a free slot, and
        make its workspace there (clone or fetch first; ``rebase``: its start rebased
        onto trunk, for a resolve worker): the workspace's path on that host, for the
        worker's launch."""
        actor = self._placed(name, attempt, rebase=rebase, hooks=hooks,
                             trunk_commit=trunk_commit)
        try:
            where = self._placement(actor)
            if where is None:
                raise ClusterError(
                    f"{cluster.actor_name(self.project, name, attempt)}: no host took it "
                    f"within {self.place_timeout:g}s (no free {cluster.SLOT_RESOURCE} slot); "
                    "tried again when one is free")
            self._node_of[cluster.actor_name(self.project, name, attempt)] = where.node
            hook_time = hooks.config.timeout if hooks and hooks.config.after_create else 0.0
            return Path(self._get(actor.prepare.remote(), self.start_timeout + hook_time))
        except BaseException:
            self._end(actor)
            raise

    def _placement(self, actor: Any) -> Placement | None:
        """Where the attempt's actor runs, or None once it is seen waiting for a slot
        after ``place_timeout`` (an actor no host has a slot for waits, unplaced, for
        ever). One that no longer waits for a slot has a host, starting its process:
        that start is waited out (up to ``start_timeout``)."""
        where = actor.where.remote()
        deadline = time.monotonic() + self.start_timeout
        wait = self.place_timeout
        while True:
            ready, _ = ray.wait([where], timeout=wait)
            if ready:
                placed: Placement = self._get(where)
                return placed
            if self._slot_wanted() or time.monotonic() > deadline:
                return None
            wait = min(1.0, max(0.0, deadline - time.monotonic()))

    @staticmethod
    def _slot_wanted() -> bool:
        """Whether an actor on the cluster waits for a worker slot (Ray reports the
        demand it cannot place; a placed actor starting its process is not in it)."""
        try:
            status = get_cluster_status(ray.get_runtime_context().gcs_address)
        except Exception:  # unknown counts as waiting for a slot: given up, as before
            return True
        return any(cluster.SLOT_RESOURCE in request.bundle
                   for demand in status.resource_demands.ray_task_actor_demand
                   for request in demand.bundles_by_count)

    def open_window(self, name: str, attempt: int, *, command: Sequence[str],
                    environment: Mapping[str, str]) -> Window:
        """Start ``command`` for attempt ``attempt`` of issue ``name`` in its workspace on
        the host it was placed on (placed now, if ``place`` was not asked)."""
        actor = self._placed(name, attempt)
        target = cluster.actor_name(self.project, name, attempt)
        try:
            window: Window = self._get(actor.start.remote(list(command), dict(environment)),
                                       self.start_timeout)
        except AttemptRunning:
            raise  # the running attempt stays
        except BaseException:
            self._end(actor)
            raise
        return dataclasses.replace(window, pane_id=target, window_id=target)

    def _placed(self, name: str, attempt: int, *, rebase: bool = False,
                hooks: Hooks | None = None, trunk_commit: str | None = None) -> Any:
        """The attempt's actor: the one placed already, else one kept warm made this
        attempt, else a new one."""
        target = cluster.actor_name(self.project, name, attempt)
        self._connect()
        running = self._running(target)
        if running is not None:
            return running
        # one kept actor still starting holds its slot already: it is waited for (a new
        # actor would wait for a slot it holds)
        kept = self._pool.take(Counter(self._node_of.values()), self._lost_now(),
                               wait=self.place_timeout)
        actor_name = kept[0] if kept else kept_name(self.project)
        try:
            if self._claims.claim(target, actor_name) is not None:  # placed meanwhile
                if kept:
                    self._pool.add(*kept)
                return self._actor(target)
        except RayError as exc:
            if kept:
                self._pool.add(*kept)
            raise ClusterError(f"{target}: cannot be claimed ({exc})") from exc
        self._actor_of[target] = actor_name
        try:
            if kept:
                actor = kept[1]
                self._get(actor.bind.remote(name, attempt, rebase=rebase, hooks=hooks,
                                            trunk_commit=trunk_commit))
                return actor
            return self._make(actor_name, self._spec(name, attempt, rebase=rebase,
                                                     hooks=hooks))
        except BaseException:
            if kept:
                self._end(kept[1])
            self._released(target)
            raise

    def _spec(self, issue: str, attempt: int, *, rebase: bool = False,
              hooks: Hooks | None = None, idle_exit: float = 0.0) -> WorkerSpec:
        return WorkerSpec(project=self.project, issue=issue, attempt=attempt,
                          remote=self.remote, trunk=self.trunk, root=self.root,
                          snapshot_interval=self.snapshot_interval, rebase=rebase,
                          hooks=hooks, lease=self.lease, idle_exit=idle_exit)

    def _make(self, actor_name: str, spec: WorkerSpec) -> Any:
        """A worker actor on a host with a free slot (Ray spreads them over the hosts)."""
        try:
            return _RemoteWorker.options(
                name=actor_name, namespace=self.namespace, lifetime="detached",
                max_restarts=0, max_concurrency=4, num_cpus=0,
                resources={cluster.SLOT_RESOURCE: 1},
                scheduling_strategy="SPREAD").remote(spec, _this_node)
        except (ValueError, RayError) as exc:
            raise ClusterError(f"{actor_name}: cannot be placed ({exc})") from exc

    def _make_kept(self, actor_name: str) -> Any:
        """A worker actor started before it is wanted: no attempt yet."""
        return self._make(actor_name, self._spec("", 0, idle_exit=IDLE_EXIT))

    @staticmethod
    def _end(actor: Any) -> None:
        with contextlib.suppress(RayError):
            ray.kill(actor, no_restart=True)

    def list_windows(self) -> list[Window]:
        """Every worker actor of the project with its window, asked all at once."""
        self._connect()
        asked: dict[str, tuple[str, Any]] = {}
        placed: dict[str, Any] = {}
        for target, name in self._attempts().items():
            parsed = cluster.parse_actor_name(target, self.project)
            if parsed is None:
                continue
            with contextlib.suppress(ValueError):  # ended since it was listed
                actor = ray.get_actor(name, namespace=self.namespace)
                asked[target] = (parsed[0], actor.window.remote())
                if target not in self._node_of:  # once per attempt: where it runs
                    placed[target] = actor.where.remote()
        if not asked:
            return []
        refs = [*(ref for _, ref in asked.values()), *placed.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs),
                            timeout=min(self.call_timeout, LIST_TIMEOUT))
        answered = set(ready)
        for target, ref in placed.items():
            if ref in answered:
                with contextlib.suppress(RayError):
                    self._node_of[target] = ray.get(ref, timeout=0).node
        return [self._seen(target, issue, ref, ref in answered)
                for target, (issue, ref) in sorted(asked.items())]

    def _attempts(self) -> dict[str, str]:
        """Each attempt of the project Ray lists an actor for (attempt → actor name).
        Actors kept warm are the pool's; one neither kept nor claimed here was kept by
        a controller before this one (or claimed by it: its claims are read then)."""
        listed = [a["name"] for a in list_named_actors(all_namespaces=True)
                  if a["namespace"] == self.namespace
                  and a["name"].startswith(f"{self.project}:")]
        kept = [name for name in listed if is_kept_name(name, self.project)]
        self._pool.forget(kept)
        known = set(self._actor_of.values())
        if any(name not in known and name not in self._pool for name in kept):
            self._actor_of.update(self._claims.all())
            known = set(self._actor_of.values())
            for name in kept:
                if name not in known and name not in self._pool:
                    with contextlib.suppress(ValueError):
                        self._pool.add(name, ray.get_actor(name, namespace=self.namespace))
        alive = set(listed)
        for target, name in list(self._actor_of.items()):
            if name not in alive:  # ended, or gone with its host: its claim goes
                self._released(target)
        found = {target: target for target in listed if not is_kept_name(target, self.project)}
        return {**found, **self._actor_of}

    def _seen(self, target: str, issue: str, ref: Any, answered: bool) -> Window:
        gone = Window(name=issue, pane_id=target, window_id=target, alive=False)
        if not answered:  # busy or slow: it may be running, so it counts as running
            return dataclasses.replace(gone, alive=True, command="ray")
        try:
            window = ray.get(ref, timeout=0)
        except RayError:  # its host died or is cut off: an orphan, fenced by attempt
            node = self._node_of.get(target)
            if node is not None:
                self._lost_nodes[node] = time.monotonic() + LOST_NODE_HOLD
            return dataclasses.replace(gone, host_lost=True)
        return gone if window is None else dataclasses.replace(window, pane_id=target,
                                                               window_id=target)

    def kill_window(self, target: str, *, remove: bool = False) -> None:
        """End the attempt's processes and its actor; already gone is fine. ``remove``:
        its work came back, so its workspace on its host goes too."""
        self._connect()
        actor = self._running(target)
        if actor is not None:
            with contextlib.suppress(RayError):
                ray.get(actor.stop.remote(remove=remove), timeout=self.call_timeout)
            ray.kill(actor, no_restart=True)
        self._released(target)

    # -- beyond one host ----------------------------------------------------------------------

    def free_slots(self) -> int:
        """Slots free on the cluster's live nodes, as Ray last heard (a placement takes
        a moment to show)."""
        self._connect()
        try:
            free: dict[str, dict[str, float]] = \
                ray_state.available_resources_per_node()  # type: ignore[no-untyped-call]
        except RayError as exc:
            raise ClusterError(f"the cluster did not say its free slots: {exc}") from exc
        # a node this controller saw a worker lost on counts for nothing at once, not only
        # once Ray declares it dead (a placement on its slots would wait in vain)
        lost = self._lost_now()
        unheld = {node: int(resources.get(cluster.SLOT_RESOURCE, 0))
                  for node, resources in free.items() if node not in lost}
        kept = Counter(self._pool.ready(lost).values())  # their slots are a spawn's to take
        self._pool.refill(sum(unheld.values()), keep=self._keep_warm())
        if not kept:
            return sum(unheld.values())
        # Ray hears of a slot a kept actor took a moment after the actor runs: a node
        # counts no more than it has, less the attempts running there
        try:
            total: dict[str, dict[str, float]] = \
                ray_state.total_resources_per_node()  # type: ignore[no-untyped-call]
        except RayError as exc:
            raise ClusterError(f"the cluster did not say its slots: {exc}") from exc
        running = Counter(self._node_of.values())
        return sum(min(unheld.get(node, 0) + kept[node],
                       int(total.get(node, {}).get(cluster.SLOT_RESOURCE, 0)) - running[node])
                   for node in {*unheld, *kept})

    def _keep_warm(self) -> bool:
        """Whether actors are kept warm now: not while an autoscaled cluster is asked for
        nothing (its idle hosts must go), and not while an attempt of this project waits
        for a slot one of them holds (one placed by a controller that stopped mid-spawn)."""
        if self.autoscaled and not self._slots_asked:
            return False
        unplaced = any(target not in self._node_of for target in self._actor_of)
        return not (unplaced and self._slot_wanted())

    def warm_running(self) -> int:
        """Actors kept warm that run now (``cluster.warm``)."""
        return len(self._pool.ready(self._lost_now()))

    def want_slots(self, count: int) -> bool:
        """Ask Ray's autoscaler to make room for ``count`` workers, each a
        ``ralph_worker`` slot (0: withdraw the request); whether this was a change. A
        request stands until the next one replaces it; one made by a controller before
        this one's start is replaced at its first call (counted from nothing asked)."""
        if count == self._slots_asked:
            return False
        self._connect()
        from ray.autoscaler.sdk import request_resources

        try:
            request_resources(bundles=[{cluster.SLOT_RESOURCE: 1}] * count)
        except RayError as exc:
            raise ClusterError(f"the autoscaler was not asked for {count} slot(s): "
                               f"{exc}") from exc
        self._slots_asked = count
        return True

    def _lost_now(self) -> set[str]:
        now = time.monotonic()
        self._lost_nodes = {n: until for n, until in self._lost_nodes.items() if until > now}
        return set(self._lost_nodes)

    def nodes(self) -> list[NodeSlots]:
        """The live nodes with worker slots, as Ray lists them, but those this controller
        saw a worker lost on."""
        lost = self._lost_now()
        return [n for n in self._live_nodes() if n.node not in lost]

    def _live_nodes(self) -> list[NodeSlots]:
        return [NodeSlots(node=n["NodeID"], host=str(n.get("NodeManagerHostname", "")),
                          slots=int(n["Resources"][cluster.SLOT_RESOURCE]))
                for n in self._slot_nodes()]

    def _slot_nodes(self) -> list[dict[str, Any]]:
        self._connect()
        try:
            listed: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
        except RayError as exc:
            raise ClusterError(f"the cluster did not list its nodes: {exc}") from exc
        return [n for n in listed
                if n.get("Alive") and n.get("Resources", {}).get(cluster.SLOT_RESOURCE)]

    def hosts(self, agent: str | None = None, *, sandboxed: bool = False
              ) -> list[HostReport]:
        """Each live node with worker slots: its slots and what it has of what a worker
        needs (``agent``: the agent program launches run; ``sandboxed``: whether it can
        start a worker's sandbox), asked on the node itself (``doctor``)."""
        nodes = self._slot_nodes()
        asked = [_tools_on.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            n["NodeID"], soft=False)).remote(agent, sandboxed) for n in nodes]
        found = self._get(asked, ASK_TIMEOUT)
        return [HostReport(node=n["NodeID"], host=host, slots=int(n["Resources"][
            cluster.SLOT_RESOURCE]), tools=tools, sandbox=sandbox)
            for n, (host, tools, sandbox) in zip(nodes, found, strict=True)]

    def close(self) -> None:
        """End the actors kept warm, and disconnect from the cluster, if this plane
        connected; the workers, detached, keep running."""
        if ray.is_initialized():
            self._pool.close()
        if self._connected_here and ray.is_initialized():
            ray.shutdown()
        self._connected_here = False
