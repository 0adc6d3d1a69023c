"""The Ray process plane on a real cluster: a head and two worker nodes on this machine
(``ray.cluster_utils.Cluster``), the remote a bare git repository on disk.

Workers are real: each attempt is a named actor Ray places on a node with a free
``ralph_worker`` slot, which clones the project there, makes its workspace and runs a
scripted worker in a tmux server of its own; the work comes back through the remote.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import make_jj_repo, retry_until, running
from ray_kit import NAMESPACE, bare_remote, hosts_dir, local_cluster

from ralph_dev.adapters.jj_cli import JjCli, JJError, child_path
from ralph_dev.core import cluster
from ralph_dev.core.environment import ATTEMPT_VAR
from ralph_dev.core.errors import HostUnavailable
from ralph_dev.core.model import Window
from ralph_dev.hosts.ray.work import PushedWork

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'ralph-dev[ray]')")
cluster_utils = pytest.importorskip("ray.cluster_utils")

pytestmark = pytest.mark.slow

PROJECT = f"t{uuid.uuid4().hex[:8]}"
"""Unique per run: a worker's tmux server is named by project, issue and attempt, and
tmux servers are per machine."""

WORKER = ["sh", "-c", 'echo "work of $RALPH_DEV_ISSUE" > "$RALPH_DEV_ISSUE.txt" '
                      '&& jj commit -m "$RALPH_DEV_ISSUE: scripted work"']
"""The scripted worker: writes a file named for its (checked) issue and commits it."""


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Head (no slots) plus two nodes of two ``ralph_worker`` slots each."""
    with local_cluster(tmp_path_factory.getbasetemp(), PROJECT) as made:
        yield made, list(made.worker_nodes)


@pytest.fixture
def remote(tmp_path: Path, jj_bin: str) -> Path:
    """A bare git repository holding trunk ``main`` with one commit."""
    bare = bare_remote(tmp_path / "remote.git")
    seed = JjCli(make_jj_repo(tmp_path / "seed"), jj_bin=jj_bin)
    seed.run("git", "remote", "add", "origin", str(bare), touch_checkout=True).check()
    seed.run("git", "push", "--bookmark", "main", touch_checkout=True).check()
    return bare


def _controller_clone(tmp_path: Path, remote: Path, jj_bin: str) -> JjCli:
    """The controller's side: its own clone of the remote workers push to."""
    controller = JjCli(tmp_path / "controller", jj_bin=jj_bin)
    controller.run("git", "clone", "--no-colocate", str(remote), str(controller.repo),
                   cwd=tmp_path, touch_checkout=True).check()
    return controller


def _environment(issue: str, attempt: int) -> dict[str, str]:
    return {"PATH": child_path(), "JJ_USER": "worker", "JJ_EMAIL": "worker@example.com",
            "RALPH_DEV_ISSUE": issue, ATTEMPT_VAR: str(attempt)}


def _ended(plane: Any, issues: set[str]) -> list[Window] | None:
    windows = [w for w in plane.list_windows() if w.name in issues]
    done = [w for w in windows if not w.alive]
    return done if len(done) == len(issues) else None


def _mergeable(pushed: PushedWork, issue: str, attempt: int) -> str | None:
    """The commit the controller may merge for ``issue`` now (the fence): its current
    attempt's push, fetched; None while that attempt has pushed nothing."""
    found = pushed.fetch()
    bookmark = cluster.mergeable_push(issue, attempt, found)
    return found[bookmark] if bookmark is not None else None


def _fetched(controller: JjCli, bookmark: str, path: str) -> str:
    controller.read("git", "fetch", "--remote", "origin")
    return controller.read("file", "show", "-r", f'"{bookmark}"@origin', path).stdout


def test_workers_placed_by_ray_push_their_work_back(ray_cluster: Any, remote: Path,
                                                   tmp_path: Path, jj_bin: str) -> None:
    from ralph_dev.hosts.ray.plane import RayPlane

    plane = RayPlane(PROJECT, address=ray_cluster[0].address, remote=str(remote),
                     root=str(tmp_path / "hosts"), namespace=NAMESPACE)
    issues = {"APP-1", "APP-2"}
    started = time.monotonic()
    for issue in sorted(issues):
        opened = plane.open_window(issue, 1, command=WORKER,
                                     environment=_environment(issue, 1))
        assert opened.pane_id == cluster.actor_name(PROJECT, issue, 1)
    print(f"two workers placed and started in {time.monotonic() - started:.1f}s")

    ended = retry_until(lambda: _ended(plane, issues), timeout=60,
                        what="both scripted workers to finish")
    assert isinstance(ended, list)
    assert {w.exit_status for w in ended} == {0}, ended
    places = {w.name: plane.attempt(w.pane_id).where() for w in ended}
    assert len({p.node for p in places.values()}) == 2, places  # SPREAD: one per node
    # each node keeps a clone of its own
    assert len(list((tmp_path / "hosts").glob(f"*/clones/{PROJECT}/.jj"))) == 2

    pushed = {w.name: plane.attempt(w.pane_id).push() for w in ended}
    assert pushed == {issue: cluster.attempt_bookmark(issue, 1) for issue in issues}

    controller = _controller_clone(tmp_path, remote, jj_bin)
    for issue, bookmark in pushed.items():
        assert _fetched(controller, bookmark, f"{issue}.txt") == f"work of {issue}\n"

    for window in ended:
        plane.kill_window(window.pane_id)
    retry_until(lambda: not [w for w in plane.list_windows() if w.name in issues],
                timeout=30, what="the ended workers' actors to be gone")
    plane.kill_window(cluster.actor_name(PROJECT, "APP-1", 1))  # already gone: fine
    plane.close()
    assert ray.is_initialized()  # the test's connection, not the plane's: kept


def test_one_attempt_is_never_placed_twice(ray_cluster: Any, remote: Path,
                                           tmp_path: Path) -> None:
    from ralph_dev.hosts.ray.plane import RayPlane

    plane = RayPlane(PROJECT, address=ray_cluster[0].address, remote=str(remote),
                     root=str(tmp_path / "hosts"), namespace=NAMESPACE)
    waiting = ["sleep", "600"]
    first = plane.open_window("APP-3", 1, command=waiting,
                              environment=_environment("APP-3", 1))
    try:
        with pytest.raises(HostUnavailable, match=r"already started on .*never runs twice"):
            plane.open_window("APP-3", 1, command=waiting,
                              environment=_environment("APP-3", 1))
        def observed() -> Window | None:  # `env -- PATH=… sleep` shows as env until it execs
            [seen] = [w for w in plane.list_windows() if w.name == "APP-3"]
            return seen if "sleep" in seen.command else None

        seen = retry_until(observed, timeout=30, what="the attempt's command observed")
        assert isinstance(seen, Window)
        assert seen.alive and seen.pane_id == first.pane_id
    finally:
        plane.kill_window(first.pane_id)
    assert not [w for w in plane.list_windows() if w.name == "APP-3"]


def test_a_host_slow_to_start_its_attempt_is_waited_for_and_a_full_cluster_is_not(
        ray_cluster: Any, remote: Path, tmp_path: Path) -> None:
    """Under load, a host that took an attempt can take longer than the placement's
    timeout to start its process. Seen in CI: each try was given up, killed and placed
    again, and each new try started over, so the issue never started. A host that took
    the attempt is waited for; only an attempt no host has a slot for is given up."""
    import ray

    from ralph_dev.hosts.ray.plane import RayPlane

    plane = RayPlane(PROJECT, address=ray_cluster[0].address, remote=str(remote),
                     root=str(tmp_path / "hosts"), namespace=NAMESPACE, place_timeout=0.001)
    workspace = plane.place("APP-20", 1)  # no process starts within a millisecond
    target = cluster.actor_name(PROJECT, "APP-20", 1)
    assert plane.attempt(target).where().node
    assert workspace.name == "APP-20-a1"
    plane.kill_window(target)

    @ray.remote
    class Holder:
        def ready(self) -> bool:
            return True

    holders = [Holder.options(num_cpus=0, resources={cluster.SLOT_RESOURCE: 2},
                              namespace=NAMESPACE).remote() for _ in ray_cluster[1]]
    try:
        ray.get([h.ready.remote() for h in holders], timeout=60)  # every slot taken
        plane.place_timeout = 2.0
        with pytest.raises(HostUnavailable, match="no host took it within 2s"):
            plane.place("APP-21", 1)
    finally:
        for holder in holders:
            ray.kill(holder)
    assert not [w for w in plane.list_windows() if w.name == "APP-21"]


def test_a_tmux_server_killed_on_its_host_is_said_as_lost_not_as_a_dead_pane(
        ray_cluster: Any, remote: Path, tmp_path: Path) -> None:
    """Issue 37: its tmux server ended from outside (its pane never exited) was seen as
    a pane that died, charged to the issue; it is a cause outside the issue."""
    import subprocess

    from ralph_dev.hosts.ray.plane import RayPlane

    plane = RayPlane(PROJECT, address=ray_cluster[0].address, remote=str(remote),
                     root=str(tmp_path / "hosts"), namespace=NAMESPACE)
    opened = plane.open_window("APP-8", 1, command=["sleep", "600"],
                               environment=_environment("APP-8", 1))
    try:
        retry_until(lambda: [w for w in plane.list_windows() if w.name == "APP-8" and w.alive],
                    timeout=30, what="the attempt's window")
        subprocess.run(["tmux", "-L", f"ralph-{PROJECT}-APP-8-a1", "kill-server"], check=True)

        def gone() -> Window | None:
            [seen] = [w for w in plane.list_windows() if w.name == "APP-8"]
            return seen if not seen.alive else None

        seen = retry_until(gone, timeout=30, what="the killed server seen")
        assert isinstance(seen, Window)
        assert seen.server_lost and not seen.host_lost, seen
    finally:
        plane.kill_window(opened.pane_id)


def test_an_attempt_the_controller_stops_calling_stops_its_agent_within_its_lease(
        ray_cluster: Any, remote: Path, tmp_path: Path, jj_bin: str) -> None:
    """Issue 37: while the controller calls, the attempt runs past its lease; once the
    calls stop (a cut-off host, a lost controller) its host stops the agent itself
    before the lease runs out, and pushes its work once more."""
    from ralph_dev.hosts.node.worker import LEASE_STOP
    from ralph_dev.hosts.ray.plane import RayPlane

    lease = 6.0
    plane = RayPlane(PROJECT, address=ray_cluster[0].address, remote=str(remote),
                     root=str(tmp_path / "hosts"), namespace=NAMESPACE, lease=lease)
    work = ["sh", "-c", 'echo "work of $RALPH_DEV_ISSUE" > "$RALPH_DEV_ISSUE.txt"; sleep 600']
    opened = plane.open_window("APP-9", 1, command=work, environment=_environment("APP-9", 1))
    calls = plane.attempt(opened.pane_id)

    def alive() -> bool:
        return any(w.name == "APP-9" and w.alive for w in plane.list_windows())

    try:
        retry_until(alive, timeout=30, what="the attempt's window")
        renewing_until = time.monotonic() + lease * 1.5
        while time.monotonic() < renewing_until:  # the carrier's calls
            calls.exchange({}, {}, [], 0.5)
            assert alive(), "stopped while the controller was calling"
        silent = time.monotonic()
        retry_until(lambda: not alive(), timeout=lease * 2, what="the agent stopped")
        stopped_after = time.monotonic() - silent
        assert stopped_after < lease, stopped_after  # before the lease ran out
        assert stopped_after >= lease * LEASE_STOP - 1.5, stopped_after
        controller = _controller_clone(tmp_path, remote, jj_bin)
        pushed = cluster.attempt_bookmark("APP-9", 1)

        def pushed_work() -> str | None:  # its host pushes once the agent has stopped
            with contextlib.suppress(JJError):
                return _fetched(controller, pushed, "APP-9.txt")
            return None

        assert retry_until(pushed_work, timeout=30, what="the last push") == "work of APP-9\n"
        with pytest.raises(HostUnavailable, match="lease ran out"):  # no renewal counted
            calls.exchange({}, {}, [], 0.1)
    finally:
        plane.kill_window(opened.pane_id)


def test_doctor_checks_the_cluster_and_each_node(
        ray_cluster: Any, remote: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    from ralph_dev.control.checks.doctor import cluster_checks
    from ralph_dev.core.config import AgentSettings, ClusterSettings, ProjectSettings
    from ralph_dev.hosts.ray.plane import ClusterError, check_reachable

    settings = ProjectSettings(name=PROJECT, repo=remote, cluster=ClusterSettings(
        address=ray_cluster[0].address, remote=str(remote)),
        agent=AgentSettings(runner="command", command="sh -c 'exit 0'"))
    checks = cluster_checks(settings)
    assert (checks[0].name, checks[0].ok, checks[0].detail) == (
        f"cluster {PROJECT}", True, "2 nodes, 4 worker slots")
    assert len(checks) == 3 and all(c.ok and c.name.startswith("node ") for c in checks[1:])
    assert "2 slots; has bwrap, git, jj, setpriv, the agent (sh), tmux" in checks[1].detail
    # the agent program the launches run, asked on each node
    elsewhere = dataclasses.replace(settings, agent=AgentSettings(
        runner="command", command="no-such-agent-here --go"))
    missing = cluster_checks(elsewhere)[1:]
    assert missing and not any(c.ok for c in missing)
    assert all("missing the agent (no-such-agent-here)" in c.detail for c in missing)
    # a node whose ralph-dev dir cannot be made (a file where its XDG config dir should
    # be) starts no sandboxed worker: said, with the path and the fix (issue 37)
    blocked = hosts_dir(tmp_path_factory.getbasetemp()) / "node1" / "config"
    shutil.rmtree(blocked, ignore_errors=True)
    blocked.write_text("not a directory\n")
    try:
        sandboxed = cluster_checks(dataclasses.replace(settings, agent=AgentSettings(
            runner="command", command="sh -c 'exit 0'", sandbox="bwrap")))[1:]
    finally:
        blocked.unlink()
    bad = [c for c in sandboxed if not c.ok]
    assert len(bad) == 1 and len(sandboxed) == 2, sandboxed
    assert "cannot start a sandboxed worker" in bad[0].detail, bad
    assert f"{blocked}/ralph-dev" in bad[0].detail and "XDG_CONFIG_HOME" in bad[0].detail
    # an address nothing listens at is said at once (Ray itself retries for minutes)
    started = time.monotonic()
    with pytest.raises(ClusterError, match=r"cannot reach the Ray cluster at 127\.0\.0\.1:1"):
        check_reachable("127.0.0.1:1")
    assert time.monotonic() - started < 5


def test_a_new_attempt_resumes_from_the_last_snapshot_and_only_it_can_land(
        ray_cluster: Any, remote: Path, tmp_path: Path, jj_bin: str) -> None:
    """Attempt 1 is cut off (still running and pushing snapshots, as behind a network
    partition); attempt 2 starts from its last snapshot, and only attempt 2's push is
    the issue's mergeable work."""
    from ralph_dev.hosts.ray.plane import RayPlane

    plane = RayPlane(PROJECT, address=ray_cluster[0].address, remote=str(remote),
                     root=str(tmp_path / "hosts"), snapshot_interval=1.0, namespace=NAMESPACE)
    pushed = PushedWork(_controller_clone(tmp_path, remote, jj_bin))
    first = plane.open_window("APP-4", 1, environment=_environment("APP-4", 1),
                              command=["sh", "-c", "echo 'a1 was here' > notes.txt; sleep 600"])
    try:
        a1 = cluster.attempt_bookmark("APP-4", 1)
        retry_until(lambda: a1 in pushed.fetch()
                    and _fetched(pushed.jj, a1, "notes.txt") == "a1 was here\n",
                    timeout=60, what="attempt 1's snapshot on the remote, unasked")
        assert _mergeable(pushed, "APP-4", 1) == pushed.fetch()[a1]

        second = plane.open_window(
            "APP-4", 2, environment=_environment("APP-4", 2),
            command=["sh", "-c", "echo 'a2 was here' >> notes.txt && jj commit -m 'APP-4: done'"])
        a2 = cluster.attempt_bookmark("APP-4", 2)
        landed = retry_until(lambda: _mergeable(pushed, "APP-4", 2), timeout=60,
                             what="attempt 2's push after its worker ended")
        assert _fetched(pushed.jj, a2, "notes.txt") == "a1 was here\na2 was here\n"
        assert [w.alive for w in plane.list_windows() if w.pane_id == first.pane_id] == [True]
        # attempt 1 goes on pushing, and its push is never what lands
        assert _mergeable(pushed, "APP-4", 2) == landed == pushed.fetch()[a2] != pushed.fetch()[a1]
        assert _mergeable(pushed, "APP-4", 3) is None
        plane.kill_window(second.pane_id)
    finally:
        plane.kill_window(first.pane_id)


def test_a_dead_node_ends_its_worker_and_the_next_attempt_resumes_elsewhere(
        ray_cluster: Any, remote: Path, tmp_path: Path, jj_bin: str) -> None:
    """A host fails mid-work: its worker is seen dead within seconds, its agent's
    processes end with it (never two live agents), and the next attempt starts on
    another node from the last snapshot the lost one pushed."""
    from ralph_dev.hosts.ray.plane import RayPlane

    made, _nodes = ray_cluster
    made.add_node(num_cpus=1, resources={cluster.SLOT_RESOURCE: 2})  # two nodes stay
    made.wait_for_nodes()
    plane = RayPlane(PROJECT, address=made.address, remote=str(remote),
                     root=str(tmp_path / "hosts"), snapshot_interval=1.0, call_timeout=10.0,
                     namespace=NAMESPACE)
    pushed = PushedWork(_controller_clone(tmp_path, remote, jj_bin))
    first = plane.open_window("APP-6", 1, environment=_environment("APP-6", 1),
                              command=["sh", "-c", "echo 'a1 was here' > notes.txt; sleep 600"])
    a1 = cluster.attempt_bookmark("APP-6", 1)
    retry_until(lambda: a1 in pushed.fetch(), timeout=60, what="attempt 1's first snapshot")
    [seen] = [w for w in plane.list_windows() if w.pane_id == first.pane_id]
    assert seen.alive and seen.pid is not None
    lost = plane.attempt(first.pane_id).where().node
    [doomed] = [n for n in made.worker_nodes if n.node_id == lost]

    made.remove_node(doomed, allow_graceful=False)
    died = time.monotonic()
    retry_until(lambda: [w.alive for w in plane.list_windows()
                         if w.pane_id == first.pane_id] in ([False], []),
                timeout=30, what="the lost node's worker to be seen dead")
    print(f"a dead node's worker seen dead after {time.monotonic() - died:.1f}s")
    # its slots stop counting at once (issue 37: Ray counted them a while longer, and the
    # next attempt waited for a slot there in vain)
    assert lost not in [n.node for n in plane.nodes()]
    assert plane.free_slots() == sum(n.slots for n in plane.nodes()), ray.nodes()
    retry_until(lambda: not running(seen.pid), timeout=30,  # type: ignore[arg-type]
                what="the lost worker's agent process to end with its node")

    second = plane.open_window(
        "APP-6", 2, environment=_environment("APP-6", 2),
        command=["sh", "-c", "echo 'a2 was here' >> notes.txt && jj commit -m 'APP-6: done'"])
    assert plane.attempt(second.pane_id).where().node != lost
    retry_until(lambda: _mergeable(pushed, "APP-6", 2), timeout=60,
                what="attempt 2's push")
    assert _fetched(pushed.jj, cluster.attempt_bookmark("APP-6", 2), "notes.txt") \
        == "a1 was here\na2 was here\n"
    plane.kill_window(second.pane_id)
    plane.kill_window(first.pane_id)  # a dead node's actor: nothing to end, no error


def test_a_launch_travels_to_its_host_and_its_session_comes_back(
        ray_cluster: Any, remote: Path, tmp_path: Path) -> None:
    """A host sees nothing of the controller's directories: the worker's own directory
    travels with its start, its paths moved to the copy there, and the transcript it
    resumes lies where Claude Code looks for that workspace; its session comes back."""
    from ralph_dev.core.cluster import session_folder
    from ralph_dev.hosts.bundle import pack
    from ralph_dev.hosts.ray.plane import RayPlane

    plane = RayPlane(PROJECT, address=ray_cluster[0].address, remote=str(remote),
                     root=str(tmp_path / "hosts"), namespace=NAMESPACE)
    target = cluster.actor_name(PROJECT, "APP-7", 1)
    worker = tmp_path / "controller" / "workers" / "APP-7"
    for sub in ("home", "run", "sessions"):
        (worker / sub).mkdir(parents=True)
    (worker / "sessions" / "sess-0001-abcd.jsonl").write_text('{"type": "user"}\n')
    workspace = plane.place("APP-7", 1)
    plane.attempt(target).receive(pack({"worker": worker}, trees=[worker]))
    environment = {**_environment("APP-7", 1), "HOME": str(worker / "home"),
                   "RALPH_DEV_RUN_DIR": str(worker / "run")}
    plane.open_window("APP-7", 1, command=[
        "sh", "-c", 'echo "$HOME" > "$RALPH_DEV_RUN_DIR/seen" && '
                    'for f in "$HOME"/.claude/projects/*/sess-0001-abcd.jsonl; '
                    'do echo more >> "$f"; done'],
                      environment=environment)
    retry_until(lambda: _ended(plane, {"APP-7"}), timeout=60, what="the worker to finish")

    [copy] = (tmp_path / "hosts").glob(f"*/runs/{PROJECT}/APP-7-a1/worker")
    assert (copy / "run" / "seen").read_text() == f"{copy / 'home'}\n"
    assert plane.attempt(target).transcript("sess-0001-abcd") == b'{"type": "user"}\nmore\n'
    assert plane.attempt(target).transcript("../../etc/passwd") is None
    folder = session_folder(workspace)
    assert folder is not None
    assert (copy / "home/.claude/projects" / folder / "sess-0001-abcd.jsonl").is_file()
    assert not (worker / "run" / "seen").exists()  # the controller's directory: untouched
    plane.kill_window(target)
    plane.close()


def test_a_spawn_takes_an_actor_kept_warm_and_each_attempt_is_claimed_once(
        ray_cluster: Any, remote: Path, tmp_path: Path) -> None:
    """Issues 34 and 37: Ray starts a new process for each actor, most of a spawn's
    second. Actors are kept started on free slots (``cluster.warm``), and a spawn makes
    one its attempt. The attempt is claimed once in Ray's store: another controller
    (or this one, restarted) finds it there, never starts it twice, and takes over the
    kept actors left to it rather than starting more."""
    from ralph_dev.hosts.ray.plane import RayPlane
    from ralph_dev.hosts.ray.warm import Claims, is_kept_name

    def kept_names() -> set[str]:
        return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == NAMESPACE and is_kept_name(a["name"], PROJECT)}

    def plane_of(warm: int) -> RayPlane:
        return RayPlane(PROJECT, address=ray_cluster[0].address, remote=str(remote),
                        root=str(tmp_path / "hosts"), namespace=NAMESPACE, warm=warm)

    plane, later = plane_of(2), plane_of(2)
    target = cluster.actor_name(PROJECT, "APP-30", 1)
    try:
        # each tick's look at the free slots keeps actors started on them
        retry_until(lambda: (plane.free_slots(), plane.warm_running() == 2)[-1],
                    timeout=60, what="2 actors kept")
        slots = sum(n.slots for n in plane.nodes())
        # a kept actor's slot is a spawn's to take: still free
        retry_until(lambda: plane.free_slots() == slots, timeout=30, what="every slot free")
        kept = kept_names()
        assert len(kept) == 2
        opened = plane.open_window("APP-30", 1, command=["sleep", "600"],
                                   environment=_environment("APP-30", 1))
        assert opened.pane_id == target
        holder = Claims(PROJECT).holder(target)
        assert holder in kept  # the attempt runs in a process started before it
        assert plane.warm_running() == 1
        retry_until(lambda: plane.free_slots() == slots - 1, timeout=30, what="one slot taken")
        retry_until(lambda: [w for w in plane.list_windows() if w.name == "APP-30"
                             and w.alive and "sleep" in w.command],
                    timeout=30, what="the attempt's command running")

        # another controller: finds the attempt by its claim, never starts it twice
        [seen] = [w for w in later.list_windows() if w.name == "APP-30"]
        assert seen.pane_id == target and seen.alive
        with pytest.raises(HostUnavailable, match="never runs twice"):
            later.open_window("APP-30", 1, command=["sleep", "600"],
                              environment=_environment("APP-30", 1))
        assert Claims(PROJECT).holder(target) == holder
        # ... and keeps the actor left kept (the first controller's), starting only one
        # more to make its 2
        retry_until(lambda: (later.free_slots(), later.warm_running() == 2)[-1],
                    timeout=60, what="2 kept, later")
        assert len(kept_names() - {holder}) == 2, kept_names()  # its own and the left one
        plane._pool.close()  # the first controller is gone: only `later` keeps actors

        later.kill_window(target)
        assert Claims(PROJECT).holder(target) is None  # ended: its claim goes
        assert not [w for w in later.list_windows() if w.name == "APP-30"]
    finally:
        plane.kill_window(target)
        plane.close()
        later.close()
    retry_until(lambda: not kept_names(), timeout=30, what="the kept actors ended")


def test_actors_are_kept_warm_only_while_an_autoscaled_cluster_is_asked_for_slots(
        ray_cluster: Any, remote: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A kept actor holds its slot, so its host is never idle: on a cluster whose
    autoscaler may stop idle hosts, none is kept once nothing waits for a slot. One no
    attempt took ends by itself after a while (its controller may be gone), and the
    controller keeps another in its place."""
    from ralph_dev.hosts.ray import plane as plane_module
    from ralph_dev.hosts.ray.plane import RayPlane
    from ralph_dev.hosts.ray.warm import is_kept_name

    def kept_names() -> set[str]:
        return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == NAMESPACE and is_kept_name(a["name"], PROJECT)}

    monkeypatch.setattr(plane_module, "IDLE_EXIT", 3.0)
    plane = RayPlane(PROJECT, address=ray_cluster[0].address, remote=str(remote),
                     root=str(tmp_path / "hosts"), namespace=NAMESPACE, warm=1,
                     autoscaled=True)
    try:
        plane.free_slots()
        assert plane.warm_running() == 0 and not kept_names()  # nothing asked for
        plane.want_slots(3)
        retry_until(lambda: (plane.free_slots(), plane.warm_running() == 1)[-1], timeout=60,
                    what="1 actor kept")
        [first] = kept_names()
        # it ends by itself, unclaimed, and the next look keeps another
        retry_until(lambda: first not in kept_names(), timeout=30, what="the idle one's end")
        retry_until(lambda: (plane.list_windows(), plane.free_slots(),
                             plane.warm_running() == 1)[-1], timeout=60,
                    what="another kept in its place")
        assert first not in kept_names() and len(kept_names()) == 1
        plane.want_slots(0)  # the backlog drained: the host may go idle
        plane.free_slots()
        retry_until(lambda: not kept_names(), timeout=30, what="no actor kept")
    finally:
        plane.close()


def test_a_spawn_waits_for_an_actor_kept_warm_that_holds_the_last_free_slot(
        ray_cluster: Any, remote: Path, tmp_path: Path) -> None:
    """Seen on a two-slot cluster: the first tick's look started an actor kept warm on
    every free slot, and its spawns, finding none running yet, started actors of their
    own, which waited for a slot the kept ones held: no host took them within 20 s. A
    spawn now waits for a kept actor still starting; and a claimed attempt waiting for
    a slot (its controller stopped mid-spawn) makes the kept actors give theirs up."""
    from ralph_dev.hosts.ray.plane import RayPlane
    from ralph_dev.hosts.ray.warm import Claims, is_kept_name

    def kept_names() -> set[str]:
        return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == NAMESPACE and is_kept_name(a["name"], PROJECT)}

    probe = RayPlane(PROJECT, address=ray_cluster[0].address, remote=str(remote),
                     root=str(tmp_path / "hosts"), namespace=NAMESPACE)
    slots = retry_until(lambda: (lambda free: free if free == sum(
        n.slots for n in probe.nodes()) else None)(probe.free_slots()), timeout=30,
        what="every slot free")
    assert isinstance(slots, int)

    def plane_of(warm: int) -> RayPlane:
        return RayPlane(PROJECT, address=ray_cluster[0].address, remote=str(remote),
                        root=str(tmp_path / "hosts"), namespace=NAMESPACE, warm=warm,
                        place_timeout=8.0)

    plane, other = plane_of(slots), plane_of(0)
    other.call_timeout = plane.call_timeout = 2.0
    targets = [cluster.actor_name(PROJECT, issue, 1) for issue in ("APP-40", "APP-41")]
    try:
        assert plane.free_slots() == slots  # every free slot gets a kept actor, starting
        kept = kept_names()
        assert len(kept) == slots
        plane.open_window("APP-40", 1, command=["sleep", "600"],
                          environment=_environment("APP-40", 1))  # not refused
        assert Claims(PROJECT).holder(targets[0]) in kept

        # every other slot held by a kept actor, running
        retry_until(lambda: (plane.free_slots(), plane.warm_running() == slots - 1)[-1],
                    timeout=60, what="the other kept actors running")
        # another controller claimed an attempt and stopped before its actor had a slot
        other._placed("APP-41", 1)
        pending = Claims(PROJECT).holder(targets[1])
        assert pending is not None and pending not in kept

        def placed() -> bool:
            plane.list_windows()  # the tick's look: it finds the claimed attempt ...
            plane.free_slots()  # ... waiting for a slot: the kept actors give theirs up
            with contextlib.suppress(HostUnavailable):  # not placed within the call's time
                return plane.attempt(targets[1]).where().node != ""
            return False

        retry_until(placed, timeout=60, what="the waiting attempt placed")
        # the kept actors gave their slots up (the next looks may keep new ones on the
        # slots left free)
        assert Claims(PROJECT).holder(targets[1]) == pending
        assert not kept_names() & (kept - {Claims(PROJECT).holder(targets[0])})
    finally:
        for target in targets:
            plane.kill_window(target)
        plane.close()
        probe.close()


def test_threads_that_reach_the_cluster_at_once_connect_once(
        ray_cluster: Any, remote: Path) -> None:
    """Seen after a controller's restart: its first tick failed with Ray's "Perhaps you
    called ray.init twice by accident?", two of its threads (the tick's look, the
    carrier's) having connected at once."""
    import subprocess
    import sys

    script = f"""
import threading
from ralph_dev.hosts.ray.plane import RayPlane
plane = RayPlane({PROJECT!r}, address={ray_cluster[0].address!r}, remote={str(remote)!r},
                 namespace={NAMESPACE!r})
failed = []
def look():
    try:
        plane.list_windows()
    except BaseException as exc:
        failed.append(repr(exc))
threads = [threading.Thread(target=look) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not failed, failed
plane.close()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
