"""A whole ralph-dev instance for end-to-end tests: a real jj repo, a local
tracker project, a private tmux socket, the real daemon/controller, and the
scripted demo agent as the worker. Everything is driven through the CLI, as a
person would."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from conftest import retry_until

from ralph_dev.core.paths import sandbox_env

REPO_ROOT = Path(__file__).resolve().parent.parent

TWELVE_ISSUE_PLAN = """
[[phase]]
ref = "core"
title = "Phase 1: core"
  [[phase.task]]
  ref = "a"
  title = "Storage layer"
  priority = 1
  [[phase.task]]
  ref = "b"
  title = "Config loader"
  priority = 2
  [[phase.task]]
  ref = "c"
  title = "Domain model"
  blocked_by = ["a"]
  [[phase.task]]
  ref = "d"
  title = "Service API"
  blocked_by = ["b", "c"]
  [[phase.task]]
  ref = "e"
  title = "CLI"
  blocked_by = ["d"]

[[phase]]
ref = "polish"
title = "Phase 2: polish"
blocked_by = ["core"]
  [[phase.task]]
  ref = "f"
  title = "Docs"
  [[phase.task]]
  ref = "g"
  title = "Examples"
  blocked_by = ["f"]
  [[phase.task]]
  ref = "h"
  title = "Packaging"

[[task]]
ref = "i"
title = "Logging"
[[task]]
ref = "j"
title = "Metrics"
blocked_by = ["i"]
"""


SYSTEM_GIT = "/usr/bin/git"
"""The person's git: Debian 12's 2.39, older than the git jj works with."""


def person_gits(jj_bin: str) -> list[str]:
    """Every git the person's repository must stay readable by: the system's and the
    newer one installed beside jj (the one ralph-dev puts first on its own PATH)."""
    beside_jj = Path(os.path.realpath(jj_bin)).parent / "git"
    found = [g for g in (SYSTEM_GIT, str(beside_jj)) if Path(g).is_file()]
    assert len(found) == 2, f"expected {SYSTEM_GIT} and {beside_jj} on this machine"
    return found


def git(repo: Path, *args: str, git_bin: str = SYSTEM_GIT) -> subprocess.CompletedProcess[str]:
    """The person running git in their checkout (their own identity, no ralph-dev env)."""
    env = {"PATH": os.defpath, "HOME": str(repo.parent), "GIT_AUTHOR_NAME": "Pat",
           "GIT_AUTHOR_EMAIL": "pat@example.com", "GIT_COMMITTER_NAME": "Pat",
           "GIT_COMMITTER_EMAIL": "pat@example.com"}
    return subprocess.run([git_bin, *args], cwd=repo, env=env, capture_output=True, text=True,
                          check=False)


def make_person_repo(path: Path, *, branch: str = "main") -> Path:
    """A plain git repository as a person has it: one commit on ``branch`` (made with
    Debian's git 2.39), then uncommitted work: a modified file, a staged new file and
    an untracked one."""
    path.mkdir(parents=True)
    assert git(path, "init", "-q", "-b", branch).returncode == 0
    (path / "README.md").write_text("# the person's project\n")
    (path / ".gitignore").write_text("node_modules/\ntarget/\n.env\n")
    assert git(path, "add", ".").returncode == 0
    assert git(path, "commit", "-q", "-m", "initial commit").returncode == 0
    (path / "README.md").write_text("# the person's project\n\nhalf-written line")
    (path / "staged.txt").write_text("staged, not committed\n")
    assert git(path, "add", "staged.txt").returncode == 0
    (path / "scratch.txt").write_text("the person's notes, untracked\n")
    return path


def checkout_state(repo: Path, jj_bin: str) -> dict[str, Any]:
    """Everything of the person's checkout ralph-dev must leave alone: every file's
    bytes (untracked ones too; not jj's and git's own stores), git's HEAD file and
    index, the commit HEAD names, and the default workspace's ``@`` (id, author)."""
    files = {}
    for path in sorted(repo.rglob("*")):
        rel = path.relative_to(repo)
        if rel.parts[0] in (".git", ".jj") or not path.is_file():
            continue
        files[rel.as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    jj_env = {**os.environ, "PATH": os.defpath}
    default = subprocess.run(
        [jj_bin, "--ignore-working-copy", "--no-pager", "log", "--no-graph", "-r", "default@",
         "-T", 'commit_id ++ " " ++ author'], cwd=repo, env=jj_env, capture_output=True,
        text=True, check=True).stdout
    return {
        "files": files,
        "git_HEAD_file": (repo / ".git/HEAD").read_text(),
        "git_index": hashlib.sha256((repo / ".git/index").read_bytes()).hexdigest(),
        "HEAD": git(repo, "rev-parse", "HEAD").stdout.strip(),
        "default@": default,
    }


def assert_git_reads(repo: Path, jj_bin: str) -> None:
    """Both gits can still open the repository: status, log and worktree list work."""
    for git_bin in person_gits(jj_bin):
        for args in (("status",), ("log", "--oneline", "-3"), ("worktree", "list")):
            result = git(repo, *args, git_bin=git_bin)
            assert result.returncode == 0, f"{git_bin} {' '.join(args)}: {result.stderr}"
        listed = git(repo, "worktree", "list", git_bin=git_bin).stdout.splitlines()
        assert len(listed) == 1, listed  # no worktree of ralph-dev's is registered


BOOKKEEPING = {".ralph-merge", ".ralph-pending", ".ralph-pending/add", ".ralph-pending/forget"}
"""ralph-dev's own directories under a workspace root that outlive workspaces (empty once
every merge, add and forget has finished); ``.ralph-base`` holds no files of the project."""


def leftovers(root: Path) -> set[str]:
    """What is under a workspace root besides ralph-dev's base workspace and empty
    bookkeeping directories: a removed workspace's files, an unfinished marker or intent."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if not p.is_relative_to(root / ".ralph-base")} - BOOKKEEPING - {".ralph-base"}


def run_cli(*args: str, env: dict[str, str], check: bool = True, timeout: float = 60,
            python: str = sys.executable, cwd: Path | None = None,
            ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [python, "-m", "ralph_dev", *args], env=env, capture_output=True, text=True, cwd=cwd,
        timeout=timeout, stdin=subprocess.DEVNULL, check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"ralph-dev {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def lane_only(command: str, otherwise: str = "true") -> str:
    """A verify command that runs ``command`` in the merge lane's workspace and
    ``otherwise`` in a worker's (its own check at ``worker done``)."""
    return f'case "$PWD" in *ralph-lane*) {command} ;; *) {otherwise} ;; esac'


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.25) -> Any:
    """``retry_until`` at a swarm's pace (a quarter second between looks)."""
    return retry_until(predicate, timeout, interval, what)


@dataclass
class Swarm:
    root: Path
    env: dict[str, str]
    repo: Path
    jj: str
    project: str = "demo"
    script: dict[str, str] = field(default_factory=dict)
    python: str = sys.executable
    """The interpreter whose ``ralph_dev`` the CLI calls run (an installed release)."""
    tripwires_expected: bool = False
    """Every swarm walks its tripwires each tick; a trip no test caused is a false alarm
    (a test planting files says so here)."""

    # -- setup --------------------------------------------------------------

    @classmethod
    def create(cls, root: Path, jj_bin: str, tmux_socket: str, *, max_workers: int = 3,
               timing: dict[str, float] | None = None, verify: str | None = None,
               agent_seconds: float = 0.5, person: bool = False) -> Swarm:
        """``person``: the project is a person's plain git repository with uncommitted
        work (``make_person_repo``), colocated by ``init --colocate``."""
        env = sandbox_env(root, os.environ)
        env["RALPH_DEV_TMUX_SOCKET"] = tmux_socket
        env["RALPH_DEV_JJ"] = jj_bin
        env["RALPH_DEV_LOG_LEVEL"] = "INFO"
        # the suite's own load says nothing about this swarm's room (tests/conftest.py)
        env["RALPH_DEV_LIMITS_MAX_LOAD_PER_CPU"] = "0"
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        repo = root / "repo"
        swarm = cls(root=root, env=env, repo=repo, jj=jj_bin)
        if person:
            make_person_repo(repo)
        else:
            swarm.make_repo()
        agent = f"{shlex.quote(sys.executable)} -m ralph_dev.devtools.demo_agent {{issue}} {{role}}"
        # the network as before: what a worker may reach is tests/test_egress.py's
        args = ["init", swarm.project, "--repo", str(repo), "--agent", "command",
                "--agent-command", agent, "--max-workers", str(max_workers), "--key", "DEMO",
                "--network", "open"]
        if person:
            args.append("--colocate")
        if verify:
            args += ["--verify", verify]
        run_cli(*args, env=env)
        swarm.shared.mkdir()
        swarm.share([str(swarm.shared)])  # the demo agent's script and locks
        swarm.set_timing({"poll_interval": 0.3, "stall_timeout": 60, "restart_timeout": 60,
                          "retry_base": 0.5, "retry_cap": 2, "health_interval": 1,
                          "heartbeat_stale": 10, "tripwire_interval": 0, **(timing or {})})
        swarm.env["RALPH_DEV_DEMO_SCRIPT"] = str(swarm.shared / "agent-script.json")
        swarm.script = {"*": f"work:{agent_seconds}"}
        swarm.write_script()
        return swarm

    def make_repo(self) -> None:
        self.repo.mkdir(parents=True)
        jj_env = {**self.env, "JJ_USER": "Test", "JJ_EMAIL": "test@example.com"}

        def jj(*args: str) -> None:
            subprocess.run([self.jj, *args], cwd=self.repo, env=jj_env, check=True,
                           capture_output=True)

        jj("git", "init", "--colocate")
        (self.repo / "README.md").write_text("# demo project\n")
        jj("commit", "-m", "initial commit")
        jj("bookmark", "create", "main", "-r", "@-")

    @property
    def shared(self) -> Path:
        """A directory every sandboxed worker may use (``agent.shared_paths``): the demo
        agent's script, and the locks that catch two agents on one issue."""
        return self.root / "shared"

    @property
    def config_file(self) -> Path:
        """ralph-dev's config file (every project's), as the CLI and daemon read it."""
        return Path(self.env["XDG_CONFIG_HOME"]) / "ralph-dev/config.toml"

    def share(self, paths: list[str]) -> None:
        """Let sandboxed workers reach ``paths`` too (``agent.shared_paths``)."""
        self._add_agent_line(f"shared_paths = {json.dumps(paths)}")

    def set_sandbox(self, sandbox: str) -> None:
        """``agent.sandbox``: "off" lets the demo agent's hostile scripts reach anything."""
        self._add_agent_line(f"sandbox = {json.dumps(sandbox)}")

    def _add_agent_line(self, line: str) -> None:
        config = self.config_file
        text = config.read_text()
        command = next(c for c in text.splitlines() if c.startswith("command = "))
        config.write_text(text.replace(command, f"{command}\n{line}", 1))

    def lock_agents(self) -> Path:
        """Have each demo agent hold an exclusive lock named after its issue for as long
        as it lives (``RALPH_DEV_DEMO_LOCKS``), on every node of this machine: a second
        live agent of one issue leaves ``ISSUE.TWICE`` in the directory returned."""
        locks = self.shared / "locks"
        locks.mkdir(exist_ok=True)
        self.env["RALPH_DEV_DEMO_LOCKS"] = str(locks)
        return locks

    def use_cluster(self, address: str, remote: Path, snapshot_interval: float = 2) -> None:
        """Place this swarm's workers on the Ray cluster at ``address``; their code comes
        back through ``remote``, a bare git repository made here (the repo's origin)."""
        subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
        subprocess.run(["git", "-C", str(self.repo), "remote", "add", "origin", str(remote)],
                       check=True)
        with self.config_file.open("a") as config:
            config.write(f'\n[projects.{self.project}.cluster]\naddress = "{address}"\n'
                         f"snapshot_interval = {snapshot_interval}\n")

    def commit_file(self, name: str, text: str) -> None:
        """``name`` committed on trunk as a person would, before the swarm starts (the
        project's own files: a .gitignore, a build script)."""
        (self.repo / name).write_text(text)
        env = {**self.env, "JJ_USER": "Test", "JJ_EMAIL": "test@example.com"}
        for args in (["commit", "-m", f"add {name}"], ["bookmark", "set", "main", "-r", "@-"]):
            subprocess.run([self.jj, *args], cwd=self.repo, env=env, check=True,
                           capture_output=True)

    def set_timing(self, timing: dict[str, float]) -> None:
        config = self.config_file
        lines = [f"\n[projects.{self.project}.timing]"]
        lines += [f"{k} = {v}" for k, v in timing.items()]
        config.write_text(config.read_text() + "\n".join(lines) + "\n")

    def write_script(self) -> None:
        Path(self.env["RALPH_DEV_DEMO_SCRIPT"]).write_text(json.dumps(self.script))

    def import_plan(self, text: str = TWELVE_ISSUE_PLAN) -> list[str]:
        plan = self.root / "plan.toml"
        plan.write_text(text)
        run_cli("issue", "import", self.project, str(plan), env=self.env)
        return [i["identifier"] for i in self.issues()]

    # -- observing ----------------------------------------------------------

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        # from the swarm's own directory: `-m` puts the cwd first on sys.path, and the
        # repository's ralph_dev/ must not shadow the interpreter's installed one
        return run_cli(*args, env=self.env, check=check, python=self.python, cwd=self.root)

    def issues(self) -> list[dict[str, Any]]:
        return json.loads(self.cli("issue", "list", self.project, "--json").stdout)

    def issue(self, identifier: str) -> dict[str, Any]:
        return json.loads(self.cli("issue", "show", identifier, "--json").stdout)

    def status(self) -> dict[str, Any]:
        return json.loads(self.cli("status", self.project, "--json").stdout)

    @property
    def state_dir(self) -> Path:
        """ralph-dev's state of this project: events, heartbeat, logs, records."""
        return Path(self.env["XDG_STATE_HOME"]) / "ralph-dev" / self.project

    def heartbeat(self) -> dict[str, Any]:
        """The controller's last heartbeat ({} before its first tick wrote one)."""
        try:
            beat = json.loads((self.state_dir / "heartbeat.json").read_text())
        except (OSError, ValueError):
            return {}
        return beat if isinstance(beat, dict) else {}

    def ticks(self) -> int:
        """Ticks the running controller has made (0 before its first)."""
        return int(self.heartbeat().get("tick", 0))

    def wait_first_tick(self, timeout: float = 30) -> None:
        """``controller_started`` is written before the first tick: wait for the tick."""
        wait_for(lambda: self.ticks() >= 1, timeout, "the controller's first tick")

    def events(self) -> list[dict[str, Any]]:
        path = self.state_dir / "events.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def all_done(self) -> bool:
        return all(i["state_type"] == "completed" for i in self.issues())

    def tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["tmux", "-L", self.env["RALPH_DEV_TMUX_SOCKET"], *args],
                              capture_output=True, text=True, check=False)

    def windows(self) -> list[str]:
        out = self.tmux("list-windows", "-a", "-F", "#{window_name}")
        return [w for w in out.stdout.split() if w]

    def worker_windows(self) -> list[str]:
        return [w for w in self.windows() if w.startswith("DEMO-")]

    def jj_out(self, *args: str) -> str:
        """A jj query in the repository that, like ralph-dev, never snapshots its checkout."""
        return subprocess.run([self.jj, "--no-pager", "--ignore-working-copy", *args],
                              cwd=self.repo, env=self.env, capture_output=True, text=True,
                              check=True).stdout

    def trunk_files(self) -> list[str]:
        return self.jj_out("file", "list", "-r", "main").split()

    def workspaces(self) -> list[str]:
        """Workers' workspaces (not the person's, nor ralph-dev's own base and trunk)."""
        out = self.jj_out("workspace", "list", "-T", 'name ++ "\\n"')
        return [w for w in out.split() if w and w != "default" and not w.startswith("ralph-")]

    def daemon_pid(self) -> int | None:
        path = self.state_dir / "daemon.pid"
        try:
            text = path.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    # -- control ------------------------------------------------------------

    def start(self) -> None:
        self.cli("start", self.project)

    def stop(self, workers: bool = True) -> None:
        args = ["stop", self.project] + (["--workers"] if workers else [])
        self.cli(*args, check=False)

    def teardown(self) -> None:
        self.stop(workers=True)
        self.tmux("kill-server")
        tripped = [e for e in self.events() if e["event"] == "tripwire"]
        assert self.tripwires_expected or not tripped, f"tripwires with no foreign hand: {tripped}"


def attach_fake_linear(swarm: Swarm, root: Path, *, project: str = "Alpha",
                       webhook_port: int | None = None) -> tuple[Any, str, str]:
    """Point the swarm's project at a fresh fake Linear (team DEMO, project ``project``,
    the steering labels); returns (fake, team id, project id). The caller stops it."""
    from fake_linear import FakeLinear

    from ralph_dev.core.config import Labels

    fake = FakeLinear().start()
    team = fake.add_team("DEMO")
    project_id = fake.add_project(project, [team])
    for name in Labels().steering():
        fake.add_label(name, team)
    key_file = root / "linear.key"
    key_file.write_text(fake.api_key + "\n")
    key_file.chmod(0o600)
    config = swarm.config_file
    text = config.read_text()
    table = f'[projects.{swarm.project}.tracker]\nkey = "DEMO"\n'
    assert table in text
    extra = f"webhook_port = {webhook_port}\n" if webhook_port is not None else ""
    config.write_text(text.replace(
        table, table + f'kind = "linear"\nlinear_project = "{project}"\n'
        f'linear_api_key_file = "{key_file}"\n' + extra))
    swarm.env["RALPH_DEV_LINEAR_URL"] = fake.url
    return fake, team, project_id


DEMO_AGENT_MODULE = b"ralph_dev.devtools.demo_agent"


def live_agents(locks: Path) -> dict[str, set[int]]:
    """Every demo agent of the swarm whose agents lock in ``locks``
    (:meth:`Swarm.lock_agents`) running on this machine now, by issue, whichever node or
    network namespace it runs in: the agent's own process (``python -m
    ralph_dev.devtools.demo_agent ISSUE ROLE``), not a sandbox or shell around it. Other
    tests' swarms, running beside this one, have agents of the same issues."""
    mine = f"RALPH_DEV_DEMO_LOCKS={locks}".encode()
    found: dict[str, set[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "Z" or len(argv) <= 3 or argv[1:3] != [b"-m", DEMO_AGENT_MODULE]:
                continue
            if mine not in (entry / "environ").read_bytes().split(b"\0"):
                continue
        except (OSError, IndexError):
            continue
        found.setdefault(argv[3].decode(errors="replace"), set()).add(int(entry.name))
    return found


def event_times(events: list[dict[str, Any]], kind: str) -> dict[str, datetime]:
    """First time each issue got an event of this kind."""
    out: dict[str, datetime] = {}
    for event in events:
        if event.get("event") == kind and event.get("issue") and event["issue"] not in out:
            out[event["issue"]] = datetime.fromisoformat(event["time"])
    return out


def max_concurrency(events: list[dict[str, Any]]) -> int:
    """Most workers alive at once, replaying spawn/restart against their ends."""
    live: set[str] = set()
    most = 0
    for event in events:
        kind, issue = event.get("event"), event.get("issue")
        if kind in ("spawn", "restart"):
            live.add(issue)
            most = max(most, len(live))
        elif kind in ("kill", "reap", "merge", "hold", "forget"):
            live.discard(issue)
    return most
