"""`ralph-dev demo`: the whole swarm on a throwaway project, clearly labeled.

Everything lives in one temporary directory with its own XDG dirs and a
private tmux socket, so the demo never touches a person's real config,
tracker or tmux server, and leaves nothing running: not at its end, not when
stopped by Ctrl-C, SIGTERM or SIGHUP (a signal sets a flag the demo checks
between its steps; the one teardown is in ``finally``). Workers are real Claude
Code sessions against a scripted model on loopback when the ``claude`` CLI
is available, otherwise the scripted demo agent.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ralph_dev.adapters.jj_cli import JjCli, find_jj
from ralph_dev.adapters.processes import ralph_command
from ralph_dev.agent.claude import find_claude
from ralph_dev.agent.cli_bin import find_cli
from ralph_dev.core.agent_profiles import CLAUDE, PROFILES
from ralph_dev.core.cluster import SLOT_RESOURCE
from ralph_dev.core.errors import RalphError

DEMO_PLAN = """\
# A small, real plan: a phase of dependent tasks, a second phase blocked on
# the first, and a few independent tasks.
[[phase]]
ref = "core"
title = "Phase 1: a tiny key-value store"
  [[phase.task]]
  ref = "storage"
  title = "Storage: an append-only log file"
  priority = 1
  [[phase.task]]
  ref = "index"
  title = "In-memory index over the log"
  blocked_by = ["storage"]
  [[phase.task]]
  ref = "api"
  title = "get/set/delete API"
  blocked_by = ["index"]
  [[phase.task]]
  ref = "compact"
  title = "Log compaction"
  blocked_by = ["storage"]

[[phase]]
ref = "ship"
title = "Phase 2: ship it"
blocked_by = ["core"]
  [[phase.task]]
  ref = "cli"
  title = "Command-line interface"
  [[phase.task]]
  ref = "docs"
  title = "README and usage docs"
  blocked_by = ["cli"]
  [[phase.task]]
  title = "Release notes"
  blocked_by = ["docs"]

[[task]]
ref = "lint"
title = "Lint configuration"
priority = 3
[[task]]
title = "CI workflow"
blocked_by = ["lint"]
[[task]]
title = "Benchmark script"
priority = 4
"""

PROJECT = "demo"
DEMO_KEY = "KV"

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""Signals that end the demo as Ctrl-C does: its swarm stopped, its files removed,
exit status 128 + the signal. SIGHUP arrives when its terminal goes away."""


class DemoStopped(Exception):
    """A stop signal arrived: raised where the demo checks its flag (a stop, like
    KeyboardInterrupt, not an error)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopFlag:
    """Set by a stop signal's handler; the demo checks it between its steps."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def set(self, signum: int, _frame: object) -> None:
        self.signum = signum

    def check(self) -> None:
        if self.signum is not None:
            raise DemoStopped(self.signum)


@contextlib.contextmanager
def stop_signals() -> Iterator[StopFlag]:
    """While the demo runs, STOP_SIGNALS only set the flag it yields (signal handlers
    can only be set from the main thread: elsewhere the flag stays unset)."""
    flag = StopFlag()
    previous = ({sig: signal.signal(sig, flag.set) for sig in STOP_SIGNALS}
                if threading.current_thread() is threading.main_thread() else {})
    try:
        yield flag
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _cli(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(ralph_command(*args), env=env, text=True,
                          capture_output=True, stdin=subprocess.DEVNULL, check=False)
    if check and proc.returncode != 0:  # its own words name the problem and the fix
        raise RalphError(f"the demo's `ralph-dev {' '.join(args)}` failed:\n"
                         f"{proc.stdout}{proc.stderr}".rstrip())
    return proc


def _make_repo(jj: JjCli) -> None:
    jj.repo.mkdir(parents=True)
    (jj.repo / "README.md").write_text("# kv — a demo project built by a ralph-dev swarm\n")
    jj.init_colocated(message="Initial commit", trunk="main")


@contextlib.contextmanager
def scripted_model() -> Iterator[dict[str, str]]:
    """Run the scripted fake Anthropic API on loopback; yield the env that points at it."""
    from ralph_dev.devtools.scripted_model import FakeAnthropic, demo_brain

    server = FakeAnthropic(demo_brain(DEMO_KEY))
    server.start()
    try:
        yield {
            "ANTHROPIC_BASE_URL": server.url,
            "ANTHROPIC_API_KEY": "sk-ant-demo-not-a-real-key-000000000000",
        }
    finally:
        server.stop()


NODE_DIRS = {"XDG_CONFIG_HOME": "config", "XDG_STATE_HOME": "state",
             "XDG_DATA_HOME": "data", "XDG_CACHE_HOME": "cache"}
"""Each node's own XDG directories, under its own directory (not made: a real host may
have none of them yet)."""


def node_env(hosts: Path, index: int, env: Mapping[str, str]) -> dict[str, str]:
    """The environment node ``index`` of a cluster on this machine runs with: a HOME and
    XDG directories of its own under ``hosts/nodeN`` (a real host shares none of the
    controller's), and the jj ``env`` names (``RALPH_DEV_JJ``), since a host has its own."""
    own = hosts / f"node{index}"
    (own / "home").mkdir(parents=True, exist_ok=True, mode=0o700)
    return {"HOME": str(own / "home"),
            **{var: str(own / sub) for var, sub in NODE_DIRS.items()},
            **{k: v for k, v in env.items() if k == "RALPH_DEV_JJ"}}


@contextlib.contextmanager
def scripted_openai() -> Iterator[dict[str, str]]:
    """Run the scripted fake OpenAI Responses API on loopback; yield the env that points
    Codex at it."""
    from ralph_dev.devtools.scripted_model import demo_brain
    from ralph_dev.devtools.scripted_openai import FakeOpenAI

    server = FakeOpenAI(demo_brain(DEMO_KEY))
    server.start()
    try:
        yield {
            "OPENAI_BASE_URL": f"{server.url}/v1",
            "OPENAI_API_KEY": "sk-demo-not-a-real-key-000000000000",
        }
    finally:
        server.stop()


@contextlib.contextmanager
def scripted_gemini() -> Iterator[dict[str, str]]:
    """Run the scripted fake Gemini API on loopback; yield the env that points Gemini CLI
    at it."""
    from ralph_dev.devtools.scripted_gemini import FakeGemini
    from ralph_dev.devtools.scripted_model import demo_brain

    server = FakeGemini(demo_brain(DEMO_KEY))
    server.start()
    try:
        yield {
            "GOOGLE_GEMINI_BASE_URL": server.url,
            "GEMINI_API_KEY": "AIza-demo-not-a-real-key-0000000000000",
        }
    finally:
        server.stop()


SCRIPTED_APIS: dict[str, Callable[[], contextlib.AbstractContextManager[dict[str, str]]]] = {
    "claude": scripted_model, "codex": scripted_openai, "gemini": scripted_gemini}
"""Per agent CLI, the scripted fake of its provider's API the demo runs it against."""


@contextlib.contextmanager
def local_cluster(nodes: int, slots: int, hosts: Path, env: Mapping[str, str], *,
                  node_ip: str | None = None,
                  system_config: Mapping[str, Any] | None = None) -> Iterator[Any]:
    """A Ray cluster on this machine: a head with no worker slots and ``nodes`` nodes of
    ``slots`` each, each node with a HOME and XDG directories of its own under ``hosts``
    (:func:`node_env`), as a real host has; yields it (``ray.cluster_utils.Cluster``: its
    ``address``, its ``worker_nodes``), and ends it with every process. ``node_ip``: the
    address of this machine the head and nodes say they are at (Ray's choice otherwise);
    ``system_config``: Ray's own settings for the cluster (its head's ``_system_config``)."""
    from ray import cluster_utils  # only the cluster demo needs Ray

    made = cluster_utils.Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False,  # no slots: no worker runs there
        "node_ip_address": node_ip,  # None: Ray's choice
        **({"_system_config": dict(system_config)} if system_config else {})})
    try:
        for index in range(1, nodes + 1):
            # a node's raylet, and every process it starts, runs with these
            made.add_node(num_cpus=1, resources={SLOT_RESOURCE: slots},
                          env_vars=node_env(hosts, index, env), node_ip_address=node_ip)
        made.wait_for_nodes()
        yield made
    finally:
        made.shutdown()  # type: ignore[no-untyped-call]  # untyped in Ray


def _found_cli(name: str, echo: Callable[[str], None], option: str) -> tuple[str, str] | None:
    """(name, program) of agent CLI ``name``, as ``scripts/setup.sh`` installs it; None,
    having said so, when it is missing."""
    profile = PROFILES[name]
    program = find_cli(profile)
    if program is None:
        echo(f"{option} {name} was asked for, but no {profile.program} CLI was found "
             f"(scripts/setup.sh installs it, or npm install -g {profile.package}@"
             f"{profile.pinned}).")
        return None
    return name, program


def run_demo(*, keep: bool, timeout: float, use_claude: bool | None,
             echo: Callable[[str], None] = print, workers: int = 3, cluster: int = 0,
             agent: str = "claude", review_agent: str | None = None) -> int:
    from ralph_dev.adapters.tmux import Tmux
    from ralph_dev.core.paths import sandbox_env

    jj_bin = find_jj()
    if jj_bin is None:
        echo("The demo needs jj: run scripts/setup.sh, or install jj and try again.")
        return 1
    if cluster:
        try:
            import ray  # noqa: F401 - only asked whether it is installed
        except ImportError:
            echo("--cluster needs Ray: pip install 'ralph-dev[ray]' (scripts/setup.sh "
                 "installs the test extra, which has it).")
            return 1
    review: tuple[str, str] | None = None
    if review_agent is not None:
        review = _found_cli(review_agent, echo, "--review-agent")
        if review is None:
            return 1
    if agent != CLAUDE.name or review_agent is not None:
        cli = _found_cli(agent, echo, "--agent")
        if cli is None:
            return 1
    else:
        claude = find_claude() if use_claude is not False else None
        if use_claude and claude is None:
            echo("--claude was asked for, but no claude CLI was found (scripts/setup.sh "
                 "installs it).")
            return 1
        cli = (CLAUDE.name, claude) if claude else None
    with stop_signals() as stop:
        root = Path(tempfile.mkdtemp(prefix="ralph-dev-demo-"))
        socket = f"ralph-demo-{os.getpid()}"
        env = sandbox_env(root, os.environ)
        env["RALPH_DEV_TMUX_SOCKET"] = socket
        env["RALPH_DEV_JJ"] = jj_bin
        # the demo's workers are small: a machine busy with other things (a build, a test
        # run) must not keep the demo waiting for its load to drop
        env["RALPH_DEV_LIMITS_MAX_LOAD_PER_CPU"] = "0"
        env["JJ_USER"], env["JJ_EMAIL"] = "ralph-dev demo", "demo@ralph-dev.invalid"
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        stack = contextlib.ExitStack()
        try:
            return _run_swarm(root, env, socket, cli, stack, stop, timeout=timeout,
                              echo=echo, workers=workers, cluster=cluster, review=review)
        except (KeyboardInterrupt, DemoStopped) as stopped:
            signum = stopped.signum if isinstance(stopped, DemoStopped) else signal.SIGINT
            with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
                echo(f"\nDemo stopped by {signal.Signals(signum).name}: ending its swarm"
                     + ("." if keep else " and removing its files."))
            return 128 + signum
        finally:  # the one teardown: at the end, on an error, on Ctrl-C, SIGTERM, SIGHUP
            _cli(env, "stop", PROJECT, "--workers", check=False)
            Tmux(f"ralph-{PROJECT}", socket).kill_server()
            stack.close()
            if keep:
                echo(f"Kept the demo files in {root}")
            else:
                shutil.rmtree(root, ignore_errors=True)


def _run_swarm(root: Path, env: dict[str, str], socket: str, cli: tuple[str, str] | None,
               stack: contextlib.ExitStack, stop: StopFlag, *, timeout: float,
               echo: Callable[[str], None], workers: int, cluster: int,
               review: tuple[str, str] | None = None) -> int:
    """The demo from an empty ``root`` to its swarm's end; ``run_demo`` tears it down.
    ``stop`` is checked between steps: a stop signal raises ``DemoStopped`` there.
    ``review``: the CLI (name, program) of a review step before each merge."""
    echo("=" * 72)
    echo(" ralph-dev DEMO — a throwaway project, a local tracker, a swarm of agents")
    echo(f" everything lives in {root}")
    echo(f" watch live:  tmux -L {socket} attach -t ralph-{PROJECT}")
    echo("=" * 72)
    repo = JjCli(root / "repo", jj_bin=env["RALPH_DEV_JJ"], user=(env["JJ_USER"], env["JJ_EMAIL"]),
                 environ=env)
    _make_repo(repo)
    init = ["init", PROJECT, "--repo", str(repo.repo), "--key", DEMO_KEY,
            "--max-workers", str(workers), "--verify", "test -n \"$(ls)\""]
    if cli is not None:
        profile = PROFILES[cli[0]]
        echo(f" workers: real {profile.title} ({cli[1]}) against a scripted model on loopback")
        for name, _program in {cli, *([review] if review else [])}:
            env.update(stack.enter_context(SCRIPTED_APIS[name]()))
        if review is not None:
            echo(f" reviews: a review worker on real {PROFILES[review[0]].title} ({review[1]}) "
                 "before each merge")
            env[PROFILES[review[0]].bin_variable] = review[1]
        env[profile.bin_variable] = cli[1]
        init += ["--agent", "claude"]
    else:
        echo(" workers: the scripted demo agent (no claude CLI found)")
        agent = (f"{shlex.quote(sys.executable)} -m ralph_dev.devtools.demo_agent "
                 "{issue} {role}")
        init += ["--agent", "command", "--agent-command", agent]
    stop.check()
    _cli(env, *init)
    config = root / "config/ralph-dev/config.toml"
    if cluster:
        slots = -(-workers // cluster)  # the same total, split over the nodes
        echo(f" hosts: a Ray cluster on this machine, a head and {cluster} node(s) of "
             f"{slots} worker slot(s), each with its own HOME and XDG directories under "
             f"{root / 'hosts'}; code comes back through {root / 'remote.git'}")
        address = stack.enter_context(local_cluster(cluster, slots, root / "hosts",
                                                      env)).address
        stop.check()
        remote = root / "remote.git"
        subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
        subprocess.run(["git", "-C", str(repo.repo), "remote", "add", "origin",
                        str(remote)], check=True)
        with config.open("a") as table:
            table.write(f'\n[projects.{PROJECT}.cluster]\naddress = "{address}"\n'
                        "snapshot_interval = 30\n")
    config.write_text(config.read_text() + (
        f"\n[projects.{PROJECT}.timing]\npoll_interval = 1.0\nhealth_interval = 5\n"
        "retry_base = 2\nretry_cap = 10\nstall_timeout = 120\nrestart_timeout = 120\n"))
    _agent_tables(config, cli, review)
    if review is not None:  # every execute worker's done goes to review first
        text = config.read_text()
        config.write_text(text.replace(f"[projects.{PROJECT}]\n",
                                       f"[projects.{PROJECT}]\nreview_after_execute = true\n",
                                       1))
    plan = root / "plan.toml"
    plan.write_text(DEMO_PLAN)
    created = _cli(env, "issue", "import", PROJECT, str(plan)).stdout
    echo(f"\nImported the plan:\n{created}")
    echo(_cli(env, "issue", "list", PROJECT).stdout)
    stop.check()
    _cli(env, "start", PROJECT)
    echo("Swarm started. Progress:")
    ok = _watch(env, timeout, echo, stop)
    stop.check()
    _cli(env, "stop", PROJECT, "--workers", check=False)
    echo("\nTrunk (main) now holds:")
    echo(repo.log("::main ~ root()",
                  'commit_id.short() ++ "  " ++ description.first_line() ++ "\\n"'))
    echo(_cli(env, "status", PROJECT, check=False).stdout)
    echo("Demo " + ("finished: every issue is Done." if ok else "stopped before the end."))
    return 0 if ok else 1


def _agent_tables(config: Path, cli: tuple[str, str] | None,
                  review: tuple[str, str] | None) -> None:
    """The demo project's agent keys (its CLI, and the review CLI's program), put in the
    agent table ``init`` wrote, and, with a review step, the review role's table."""
    if cli is None:
        return
    keys = (f'runner = "claude"\ncli = "{cli[0]}"\n'
            f'{PROFILES[cli[0]].bin_setting} = {json.dumps(cli[1])}\nhome = "isolated"\n')
    roles = ""
    if review is not None:
        if review[0] != cli[0]:
            keys += f'{PROFILES[review[0]].bin_setting} = {json.dumps(review[1])}\n'
        roles = f'\n[projects.{PROJECT}.roles.review]\ncli = "{review[0]}"\n'
    header = f"[projects.{PROJECT}.agent]\n"
    config.write_text(config.read_text().replace(header, header + keys, 1) + roles)


def _watch(env: dict[str, str], timeout: float, echo: Callable[[str], None],
           stop: StopFlag) -> bool:
    """Print the swarm's progress until every issue is Done (True), the timeout, or a stop."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline and stop.signum is None:
        proc = _cli(env, "status", PROJECT, "--json", "--events", "0", check=False)
        try:
            snap = json.loads(proc.stdout)
        except ValueError:
            time.sleep(1)
            continue
        counts = snap.get("issues", {})
        workers = ", ".join(f"{w['issue']} ({w['role']}, {w['state']}"
                            + (f" on {w['host']} {w['node'][:6]}" if w.get("node") else "") + ")"
                            for w in snap["workers"])
        line = (f"  done {counts.get('done', 0)}/{counts.get('total', 0)}  ready "
                f"{counts.get('ready', 0)}  blocked {counts.get('blocked', 0)}  "
                f"workers: {workers or '-'}")
        if line != last:
            echo(line)
            last = line
        if counts.get("total") and counts.get("done") == counts.get("total"):
            return True
        time.sleep(1)
    return False
