"""Issue 36, a host is shared: ``[host] max_workers`` holds across every project's
controller on the machine, two controllers admitting at once never overcommit, a killed
controller leaks no place, and projects competing for the host are served by the
person's priorities, then by each project's share."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import make_jj_repo, retry_until
from swarm_kit import Swarm, wait_for
from test_decide import issue, run, settings, win, world

from ralph_dev.adapters.host_admission import HostAdmission, HostFull, HostRoom, started_at
from ralph_dev.core.actions import Spawn
from ralph_dev.core.config import HostSettings, load_project
from ralph_dev.core.errors import ConfigError
from ralph_dev.core.host_share import ProjectLoad, host_allowance
from ralph_dev.core.model import Resources

# --- the rule ---------------------------------------------------------------------------


def test_a_project_alone_with_ready_work_takes_every_free_place() -> None:
    loads = {"app": ProjectLoad(used=1, wanting=5), "web": ProjectLoad(used=1)}
    assert host_allowance("app", loads, 4) == 2
    assert host_allowance("web", loads, 4) == 0  # wants nothing
    assert host_allowance("app", {"app": ProjectLoad(used=4, wanting=1)}, 4) == 0


def test_projects_competing_get_the_host_by_their_shares() -> None:
    even = {"app": ProjectLoad(wanting=3), "web": ProjectLoad(wanting=3)}
    assert host_allowance("app", even, 4) == 2
    assert host_allowance("web", even, 4) == 2
    # a project already at its part leaves the rest to the one below it
    assert host_allowance("app", {"app": ProjectLoad(used=2, wanting=3),
                                  "web": ProjectLoad(used=0, wanting=3)}, 4) == 0
    weighted = {"app": ProjectLoad(wanting=9, share=3.0), "web": ProjectLoad(wanting=9)}
    assert host_allowance("app", weighted, 4) == 3
    assert host_allowance("web", weighted, 4) == 1
    # above its share, a project still takes what no one below theirs waits for
    assert host_allowance("app", {"app": ProjectLoad(used=3, wanting=2),
                                  "web": ProjectLoad(used=1, wanting=0)}, 6) == 2


def test_more_urgent_work_elsewhere_is_left_its_places() -> None:
    loads = {"app": ProjectLoad(wanting=3, top_priority=3),
             "web": ProjectLoad(wanting=2, top_priority=1)}
    assert host_allowance("app", loads, 3) == 1  # web's two urgent issues first
    assert host_allowance("web", loads, 3) == 2
    # no priority is the least urgent of all
    assert host_allowance("app", {"app": ProjectLoad(wanting=2, top_priority=0),
                                  "web": ProjectLoad(wanting=2, top_priority=4)}, 2) == 0


# --- decide -----------------------------------------------------------------------------


def test_decide_starts_only_what_the_host_leaves_and_says_why_the_rest_waits() -> None:
    shared = settings(host=HostSettings(max_workers=3))
    others = {"web": ProjectLoad(used=2, wanting=0)}
    obs = world(issues=[issue(1), issue(2), issue(3)], host_loads=others)
    plan = run(obs, shared)
    spawned = [a.issue for a in plan.actions if isinstance(a, Spawn)]
    assert spawned == ["DEMO-1"]
    for waiting in ("DEMO-2", "DEMO-3"):
        wait = plan.waits[waiting]
        assert wait.kind == "slot"
        assert "3/3 workers on this host (demo: 1, web: 2) ([host] max_workers)" \
            in wait.why, wait.why
    assert plan.load == ProjectLoad(used=0, wanting=3, top_priority=0, share=1.0)
    # places free, but the more urgent issues of another project take them first
    urgent = {"web": ProjectLoad(used=1, wanting=2, top_priority=1)}
    waiting = run(world(issues=[issue(1, priority=3)], host_loads=urgent), shared)
    assert not [a for a in waiting.actions if isinstance(a, Spawn)]
    assert "1/3 workers on this host (web: 1) ([host] max_workers); its free places go " \
           "first to projects with more urgent issues" in waiting.waits["DEMO-1"].why
    # without a host limit the project's own limit is all there is
    alone = run(world(issues=[issue(1), issue(2), issue(3)], host_loads=others))
    assert len([a for a in alone.actions if isinstance(a, Spawn)]) == 3
    assert alone.load is None


def test_decide_publishes_its_load_even_with_nothing_to_start() -> None:
    shared = settings(host=HostSettings(max_workers=3))
    plan = run(world(issues=[issue(1, "started")], windows=[win("DEMO-1")], host_loads={}),
               shared)
    assert plan.load is not None and plan.load.wanting == 0 and plan.load.used == 1


# --- admission across processes ---------------------------------------------------------


def _admit_many(directory: str, project: str, issues: list[str], max_workers: int,
                start: Any, out: Any) -> None:
    """A controller of its own: admits each issue, and a worker process (a sleep) takes
    its place."""
    admission = HostAdmission(project, Path(directory))
    start.wait()
    got = []
    for name in issues:
        try:
            with admission.admit(name, max_workers=max_workers, share=1.0, top_priority=0):
                worker = subprocess.Popen(["sleep", "60"])
                admission.hold(name, worker.pid)
                got.append(worker.pid)
        except HostFull:
            continue
    out.put((project, got))


def test_controllers_admitting_at_the_same_moment_never_overcommit_the_host(
        tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    start, out = context.Event(), context.Queue()
    projects = {f"p{n}": [f"P{n}-{i}" for i in range(1, 5)] for n in range(4)}
    procs = [context.Process(target=_admit_many, args=(str(tmp_path), name, issues, 5,
                                                       start, out))
             for name, issues in projects.items()]
    for proc in procs:
        proc.start()
    start.set()
    got = dict(out.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    workers = [pid for pids in got.values() for pid in pids]
    try:
        assert len(workers) == 5, got  # 16 asked for, 5 places
        loads = HostAdmission("someone-else", tmp_path).loads()
        assert sum(load.used for load in loads.values()) == 5
    finally:
        for pid in workers:  # the controllers that started them have exited
            os.kill(pid, signal.SIGKILL)
        for pid in workers:
            retry_until(lambda pid=pid: started_at(pid) is None, 10, what=f"{pid} ended")
    # each place lived with its worker: all free again
    assert sum(load.used for load in HostAdmission("x", tmp_path).loads().values()) == 0


def test_a_killed_controller_leaks_no_place(tmp_path: Path) -> None:
    """A controller killed between its admission and its worker's start holds nothing;
    its workers that run go on counting; what it wanted stops counting with it."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from ralph_dev.adapters.host_admission import HostAdmission\n"
        "from ralph_dev.core.host_share import ProjectLoad\n"
        "a = HostAdmission('gone', Path(sys.argv[1]))\n"
        "a.publish(ProjectLoad(wanting=4), {'G-1': int(sys.argv[2])})\n"
        "cm = a.admit('G-2', max_workers=3, share=1.0, top_priority=0)\n"
        "cm.__enter__()\n"
        "print('admitted', flush=True)\n"
        "time.sleep(60)\n")
    worker = subprocess.Popen(["sleep", "60"])
    controller = subprocess.Popen(["python", "-c", script, str(tmp_path), str(worker.pid)],
                                  stdout=subprocess.PIPE, text=True)
    try:
        assert controller.stdout is not None
        assert controller.stdout.readline().strip() == "admitted"
        seen = HostAdmission("mine", tmp_path).loads()["gone"]
        assert (seen.used, seen.wanting) == (2, 4)  # its worker and its start
        controller.kill()
        controller.wait()
        seen = HostAdmission("mine", tmp_path).loads()["gone"]
        assert (seen.used, seen.wanting) == (1, 0)  # the worker that runs, nothing more
        mine = HostAdmission("mine", tmp_path)
        with mine.admit("M-1", max_workers=3, share=1.0, top_priority=0):
            pass  # held by its controller until its worker's process holds it
        with pytest.raises(HostFull, match=r"3/3 workers on this host \(gone: 1, mine: 2\)"), \
                mine.admit("M-2", max_workers=3, share=1.0, top_priority=0), \
                mine.admit("M-3", max_workers=3, share=1.0, top_priority=0):
            pass
        # a start that failed gave its place back
        assert HostAdmission("other", tmp_path).loads()["mine"].used == 1
    finally:
        controller.kill()
        worker.kill()
        worker.wait()


def test_the_hosts_memory_is_admitted_once_for_every_worker_starting_in_any_project(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 36: the memory and CPU admission hold across projects. Two projects each
    seeing 3,000 MB free would each start workers into it; under the host's lock every
    start counts the workers still starting anywhere on the host (their memory not yet
    taken), so 1,024 MB stays free: the fourth start waits, charging nothing."""
    free = {"mb": 3000.0, "load": 0.5}

    def host() -> Resources:
        return Resources(free["mb"], None, free["load"])

    app, web = (HostAdmission(name, tmp_path, sample=host) for name in ("app", "web"))
    room = HostRoom(min_free_memory_mb=1024, worker_memory_mb=512, max_load_per_cpu=4.0)
    young = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    try:
        for (admission, issue_id), proc in zip(
                ((app, "APP-1"), (web, "WEB-1"), (web, "WEB-2")), young, strict=True):
            with admission.admit(issue_id, max_workers=10, share=1.0, top_priority=0,
                                 room=room):
                admission.hold(issue_id, proc.pid)  # its worker's process holds it
        assert app.starting() == 3
        with pytest.raises(HostFull, match=r"3000 MB of memory available; 3 worker\(s\) "
                                           r"starting and this one take 512 MB each"), \
                app.admit("APP-2", max_workers=10, share=1.0, top_priority=0, room=room):
            pass
        assert "APP-2" not in json.loads((tmp_path / "app.json").read_text())["workers"]
        # once they have started (taken their memory), the free memory says it all
        monkeypatch.setattr("ralph_dev.adapters.host_admission.STARTING", 0.0)
        with app.admit("APP-2", max_workers=10, share=1.0, top_priority=0, room=room):
            pass
        free["load"] = 5.0
        with pytest.raises(HostFull, match=r"load 5\.0 per CPU, above limits\."
                                           r"max_load_per_cpu = 4"), \
                web.admit("WEB-3", max_workers=10, share=1.0, top_priority=0, room=room):
            pass
    finally:
        for proc in young:
            proc.kill()
            proc.wait()


# --- config -----------------------------------------------------------------------------


def test_the_host_table_is_the_hosts_and_its_limit_reaches_every_project(
        tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    repo = make_jj_repo(tmp_path / "repo")
    config.write_text(f'[host]\nmax_workers = 4\n\n[projects.app]\nrepo = "{repo}"\n'
                      f'share = 2\n\n[projects.web]\nrepo = "{repo}"\n')
    app, web = load_project("app", path=config), load_project("web", path=config)
    assert app.host.max_workers == web.host.max_workers == 4
    assert (app.share, web.share) == (2.0, 1.0)
    config.write_text(f'[projects.app]\nrepo = "{repo}"\n[projects.app.host]\n'
                      'max_workers = 2\n')
    with pytest.raises(ConfigError, match=r"projects\.app\.host: .*top-level \[host\]"):
        load_project("app", path=config)
    config.write_text(f'[host]\nmax_workers = 0\n[projects.app]\nrepo = "{repo}"\n')
    with pytest.raises(ConfigError, match=r"host\.max_workers: must be at least 1"):
        load_project("app", path=config)
    config.write_text(f'[host]\nworker_memory_mb = -1\n[projects.app]\nrepo = "{repo}"\n')
    with pytest.raises(ConfigError, match=r"host\.worker_memory_mb: must be at least 0"):
        load_project("app", path=config)
    config.write_text(f'[projects.app]\nrepo = "{repo}"\nshare = 0\n')
    with pytest.raises(ConfigError, match=r"projects\.app\.share: must be greater than 0"):
        load_project("app", path=config)


# --- two real projects on one host ------------------------------------------------------


@pytest.fixture
def two_projects(tmp_path: Path, jj_bin: str, tmux_socket: str) -> Iterator[Swarm]:
    """Two projects (demo, second) of three workers each on one host of three."""
    swarm = Swarm.create(tmp_path / "swarm", jj_bin, tmux_socket, max_workers=3,
                         agent_seconds=6)
    agent = next(line for line in swarm.config_file.read_text().splitlines()
                 if line.startswith("command = "))
    swarm.cli("init", "second", "--repo", str(make_jj_repo(tmp_path / "second")),
              "--agent", "command", "--agent-command", json.loads(agent.split(" = ", 1)[1]),
              "--key", "SEC", "--max-workers", "3", "--network", "open")
    text = swarm.config_file.read_text()
    header = f"[projects.{swarm.project}.timing]"
    timing = text[text.index(header) + len(header):].split("\n[", 1)[0]
    agent_at = text.index("[projects.second.agent]")
    command_end = text.index("\n", text.index("command = ", agent_at))
    text = (text[:command_end] + f"\nshared_paths = {json.dumps([str(swarm.shared)])}"
            + text[command_end:])
    swarm.config_file.write_text(f"{text}\n[projects.second.timing]{timing}\n"
                                 "\n[host]\nmax_workers = 3\n")
    yield swarm
    swarm.cli("stop", "--all", "--workers", check=False)
    swarm.teardown()


def _live_workers(swarm: Swarm) -> list[str]:
    out = swarm.tmux("list-panes", "-a", "-F", "#{window_name} #{pane_dead}").stdout
    return [line.split()[0] for line in out.splitlines()
            if line.endswith(" 0") and line.split()[0].startswith(("DEMO-", "SEC-"))]


def test_two_projects_on_a_host_of_three_never_run_more_than_three(
        two_projects: Swarm, tmp_path: Path) -> None:
    swarm = two_projects
    tasks = "".join(f'[[task]]\ntitle = "Task {n}"\n' for n in range(1, 4))
    swarm.import_plan(tasks)
    plan = tmp_path / "second.toml"
    plan.write_text(tasks)
    swarm.cli("issue", "import", "second", str(plan))
    swarm.cli("start", "--all")
    most: list[str] = []

    def everything_done() -> bool:
        nonlocal most
        live = _live_workers(swarm)
        if len(live) > len(most):
            most = live
        assert len(live) <= 3, f"more than the host's three workers at once: {live}"
        issues = [*swarm.issues(), *json.loads(
            swarm.cli("issue", "list", "second", "--json").stdout)]
        return len(issues) == 6 and all(i["state_type"] == "completed" for i in issues)

    wait_for(everything_done, 120, "all six issues of both projects Done")
    assert len(most) == 3, most  # the host was used, not left idle
    second = Path(swarm.env["XDG_STATE_HOME"]) / "ralph-dev" / "second" / "events.jsonl"
    waits = [json.loads(line) for line in second.read_text().splitlines()]
    for events in (swarm.events(), waits):
        assert not [e for e in events if e["event"] == "action_failed"
                    and "host" not in e.get("error", "")], events
    status = json.loads(swarm.cli("status", "--json").stdout)["projects"]
    assert sorted(p["project"] for p in status) == ["demo", "second"]
    for doc in status:  # each project says the host's load, every project's part in it
        assert doc["host"]["max_workers"] == 3
        assert sorted(doc["host"]["projects"]) == ["demo", "second"]
    text = swarm.cli("status", "demo").stdout
    assert "host:       " in text and "/3 workers, every project ([host] max_workers)" in text
    retry_until(lambda: not _live_workers(swarm), 30, what="every worker ended")
