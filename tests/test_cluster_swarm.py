"""Issue 26, as a person runs it: a swarm whose workers Ray places on the hosts of a
cluster (a head and two worker nodes on this machine), the remote a bare git
repository, the scripted agent. One worker node is removed while issues run: every
issue ends Done and merged once, workers ran on both nodes, no issue ever had two live
agents, and the lost node's issue starts again on the other node.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import retry_until
from ray_kit import hosts_data, hosts_dir, local_cluster, one_cluster_at_a_time
from swarm_kit import Swarm, wait_for

pytest.importorskip("ray", reason="ray is not installed (pip install 'ralph-dev[ray]')")

pytestmark = pytest.mark.slow

PLAN = "\n".join(f'[[task]]\nref = "t{n}"\ntitle = "Task {n}"\npriority = {1 + n % 3}\n'
                 for n in range(1, 7))


@pytest.fixture
def cluster_swarm(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, jj_bin: str,
                  tmux_socket: str) -> Iterator[tuple[Swarm, Any]]:
    base = tmp_path_factory.getbasetemp()
    with local_cluster(base, "demo", connect=False) as made:
        made.hosts = hosts_dir(base)
        swarm = Swarm.create(tmp_path / "swarm", jj_bin, tmux_socket, max_workers=4,
                             agent_seconds=4, timing={"max_attempts": 4, "heartbeat_stale": 30})
        swarm.use_cluster(made.address, tmp_path / "remote.git")
        # the project's workspace hook prepares each workspace where its agent works
        # (on its host, not in the controller's copy), in a file the project ignores
        swarm.commit_file(".gitignore", f"{PREPARED}\n")
        with swarm.config_file.open("a") as config:
            config.write(f'\n[projects.demo.hooks]\nafter_create = "{HOOK}"\n')
        # the two urgent issues, started together, change one file: the second to merge
        # conflicts, and a resolve worker on a host meets the conflict in its workspace
        swarm.script.update({"DEMO-3": "conflict:shared.txt", "DEMO-6": "conflict:shared.txt",
                             # the next two, one on each node, work until the test
                             # has lost one (with its node) and seen it start again
                             **dict.fromkeys(LONG, f"until:{swarm.shared / RELEASE}"),
                             # the others copy what the hook left them into their change
                             "*": f"prepared:{PREPARED}"})
        swarm.write_script()
        swarm.lock_agents()
        try:
            yield swarm, made
        finally:
            swarm.teardown()


LONG = ("DEMO-1", "DEMO-4")
RELEASE = "release-long"
"""The long issues' workers work until the test leaves this file in the shared folder."""
PREPARED = ".prepared"
HOOK = f"echo prepared in $RALPH_DEV_WORKSPACE > {PREPARED}"


def spawns(swarm: Swarm) -> list[dict[str, Any]]:
    return [e for e in swarm.events() if e["event"] in ("spawn", "restart")]


def test_a_swarm_on_three_nodes_loses_one_and_still_merges_everything_once(
        cluster_swarm: tuple[Swarm, Any]) -> None:
    swarm, made = cluster_swarm
    idents = swarm.import_plan(PLAN)
    swarm.start()

    def on_both_nodes() -> dict[str, str] | None:
        """Node → a long issue at work there, once both nodes have one."""
        working = {e["node"]: e["issue"] for e in spawns(swarm)
                   if e.get("node") and e["issue"] in LONG}
        return working if len(working) == 2 else None

    # the urgent pair first: once a node is lost, which of their ends went with it is
    # chance, and a lost end is redone on top of the other's merge, meeting no conflict
    wait_for(lambda: any(e.get("role") == "resolve" for e in spawns(swarm)), 120,
             "the urgent pair's second merge conflicting, handed to a resolve worker")
    placed = wait_for(on_both_nodes, 120, "a long worker on each worker node")
    assert isinstance(placed, dict)
    lost_node, lost_issue = sorted(placed.items())[0]
    kept_issue = sorted(placed.items())[1][1]
    [doomed] = [n for n in made.worker_nodes if n.node_id == lost_node]
    removed_at = datetime.now(UTC)
    made.remove_node(doomed, allow_graceful=False)

    def status_names_nodes() -> dict[str, Any] | None:
        doc = swarm.status()
        return doc if any(w["node"] for w in doc["workers"]) else None

    # the six issues keep four slots busy for a while: status catches some of them
    shown = wait_for(status_names_nodes, 60, "status naming a worker's node")
    assert isinstance(shown, dict) and shown["cluster"]["free_slots"] is not None
    assert sorted(n["slots"] for n in shown["cluster"]["nodes"]) in ([2], [2, 2])
    assert sum(n["workers"] for n in shown["cluster"]["nodes"]) <= len(
        [w for w in shown["workers"] if w["node"] and w["state"] == "running"])
    assert "cluster:" in swarm.cli("status", swarm.project).stdout
    assert all(w["host"] and w["window"].startswith("demo:") for w in shown["workers"]
               if w["node"])
    wait_for(lambda: "[demo agent]" in swarm.cli("logs", kept_issue, check=False).stdout, 30,
             "a live cluster worker's log, read through its actor")
    wait_for(lambda: [e["node"] for e in spawns(swarm) if e["issue"] == lost_issue][-1]
             != lost_node, 120, f"{lost_issue} started again on the node that is left")
    (swarm.shared / RELEASE).touch()  # the long workers finish now

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
    assert again[-1]["host_attempt"] > again[0]["host_attempt"]
    assert "no attempt charged" in again[-1]["reason"], again[-1]
    # (a spawn's event is written once its window is open: one placed as the node went
    # may say so a moment later)
    assert not [e for e in spawns(swarm) if e["node"] == lost_node
                and datetime.fromisoformat(e["time"]) > removed_at + timedelta(seconds=5)]
    assert {e["issue"] for e in events if e["event"] == "cluster_work_fetched"} == set(idents)
    resolves = [e for e in spawns(swarm) if e.get("role") == "resolve"]
    assert resolves and {e["issue"] for e in resolves} <= {"DEMO-3", "DEMO-6"}, resolves
    assert "shared.txt" in swarm.trunk_files()
    # the after_create hook ran on each worker's host, in the workspace its agent used
    for ident in sorted(set(idents) - set(LONG) - {"DEMO-3", "DEMO-6"}):
        change = swarm.jj_out("file", "show", "-r", "main", f"changes/{ident}.txt")
        said = change.splitlines()[-1]
        assert re.match(rf"prepared in {made.hosts}/node\d/data/ralph-dev/nodes/", said), \
            (ident, change)
        assert f"/workspaces/demo/{ident}-a" in said, (ident, change)
    # merged work leaves the remote: only what hosts start from stays
    refs = subprocess.run(["git", "ls-remote", str(swarm.root.parent / "remote.git")],
                          capture_output=True, text=True, check=True).stdout
    assert [line.split()[1] for line in refs.splitlines()] == ["refs/heads/ralph-trunk"], refs
    # an ended worker's log stays readable here after its actor is gone (up to its
    # `worker done`: a done worker's window is closed as its report is taken, which may
    # come before the answer reaches its host)
    assert f"$ ralph-dev worker done {kept_issue}" in swarm.cli("logs", kept_issue).stdout
    # hosts shared nothing with the controller but the remote: each worker wrote its
    # `done` on its host, and only the relay brought it here; its launch, moved there,
    # named nothing of the controller's directories
    runs = sorted(p for data in hosts_data(made.hosts.parent)
                  for p in data.glob("nodes/*/runs/demo/*"))
    reported = {run.name.rsplit("-a", 1)[0] for run in runs
                for path in (run / "worker" / "run" / "outbox").glob("*.json")
                if json.loads(path.read_text())["kind"] == "done"}
    assert reported >= set(idents), (reported, runs)
    here = swarm.env["XDG_STATE_HOME"]  # where workers' dirs and launch files lie
    for spec in [p for run in runs for p in (run / "launch").glob("*.launch.json")]:
        named = json.dumps(json.loads(spec.read_text()))
        assert here not in named, (here, spec, named)
        assert not spec.with_suffix(".secrets.json").exists()


def raylets() -> set[int]:
    listed = subprocess.run(["pgrep", "-x", "raylet"], capture_output=True, text=True,
                            check=False).stdout
    return {int(pid) for pid in listed.split()}


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A directory outside /tmp: a worker's sandbox hides /tmp whole, so a controller
    whose own dirs lie there never shows whether the sandbox hides them one by one, as a
    person's (under their HOME) must be."""
    base = Path("/var/tmp")
    if not os.access(base, os.W_OK):
        pytest.skip("/var/tmp is not writable here")
    made = Path(tempfile.mkdtemp(prefix="ralph-dev-test-", dir=base))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def test_the_demo_runs_on_a_cluster_of_two_nodes_and_leaves_nothing_running(
        xdg: Path, jj_bin: str, tmp_path_factory: pytest.TempPathFactory,
        outside_tmp: Path) -> None:
    """Its nodes have a HOME and XDG dirs of their own (issue 37: given those, the
    sandbox's hide list, made on the controller's host, stopped every worker)."""
    env = {**os.environ, "RALPH_DEV_JJ": jj_bin, "TMPDIR": str(outside_tmp)}
    with one_cluster_at_a_time(tmp_path_factory.getbasetemp()):
        before = raylets()
        proc = subprocess.run([sys.executable, "-m", "ralph_dev", "demo", "--cluster", "2",
                               "--scripted", "--workers", "4", "--timeout", "720"],
                              env=env, capture_output=True, text=True, timeout=840,
                              stdin=subprocess.DEVNULL, check=False)
        out = proc.stdout
        assert proc.returncode == 0, out + proc.stderr
        assert "a head and 2 node(s) of 2 worker slot(s)" in out
        assert "Demo finished: every issue is Done." in out
        trunk = out.split("Trunk (main) now holds:")[1].split("project demo")[0]
        assert len(re.findall(r"KV-\d+: ", trunk)) == 10  # every task's change, once
        nodes = set(re.findall(r"\(execute, \w+ on \S+ (\w{6})\)", out))
        assert len(nodes) == 2, out  # workers were seen on both nodes
        retry_until(lambda: raylets() <= before, timeout=30, what="the demo's raylets gone")
    # its nodes ran with their own HOME and XDG dirs, under the demo's root
    assert "own HOME and XDG directories" in out
    where = re.search(r"everything lives in (\S+)", out)
    assert where is not None and not Path(where.group(1)).exists()
    assert not (xdg / "data" / "ralph-dev").exists()  # nothing of the person's touched
