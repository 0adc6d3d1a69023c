"""`ralph-dev doctor`: each dependency OK, or exactly what to do about it.

Every tool is asked through its own adapter (tmux, jj, git, claude, gh), the
same code paths the swarm uses, so what doctor calls OK is what will run.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ralph_dev.adapters.gh import Gh
from ralph_dev.adapters.git import find_git, git_toplevel, git_version
from ralph_dev.adapters.jj import JjRepository
from ralph_dev.adapters.jj_cli import JjCli, child_path
from ralph_dev.adapters.process import CommandResult
from ralph_dev.adapters.tmux import tmux_version
from ralph_dev.adapters.tracker import open_tracker
from ralph_dev.agent.claude import AgentError, claude_version, resolve_claude_bin
from ralph_dev.agent.launch import PROGRAMS
from ralph_dev.agent.probe import try_worker_sandbox
from ralph_dev.agent.sandbox import try_sandbox
from ralph_dev.core.agent_profiles import CLAUDE, COMMAND, PROFILES, role_cli
from ralph_dev.core.config import ProjectSettings, project_names
from ralph_dev.core.errors import ConfigError, RalphError
from ralph_dev.core.model import Role

MIN_TMUX = (3, 0)
MIN_JJ = (0, 46)  # `jj workspace add --no-colocate`
MIN_GIT_FOR_JJ = (2, 42)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def version_check(name: str, result: CommandResult, minimum: tuple[int, ...],
                  fix: str) -> Check:
    """OK with the tool's own version line, or why not and ``fix``."""
    if result.returncode == 127:
        return Check(name, False, f"not found; {fix}")
    if not result.ok:
        said = result.first_line or f"exit {result.returncode}"
        return Check(name, False, f"{result.argv[0]} does not run ({said}); {fix}")
    version = result.version()
    if version and version < minimum:
        need = ".".join(map(str, minimum))
        return Check(name, False, f"{result.first_line} is older than {need}; {fix}")
    return Check(name, True, result.first_line)


def _adapter_check(name: str, ask: Callable[[], str], minimum: tuple[int, ...],
                   fix: str) -> Check:
    """For tools whose adapter raises rather than returning a result (tmux, jj)."""
    try:
        line = ask()
    except RalphError as exc:
        return Check(name, False, f"{exc}; {fix}")
    return version_check(name, CommandResult((name,), 0, line, ""), minimum, fix)


async def run_checks(config_path: Path, project: str | None,
                     load: Callable[[str], ProjectSettings]) -> list[Check]:
    checks = [
        _adapter_check("tmux", tmux_version, MIN_TMUX,
                       "install tmux >= 3.0 (apt install tmux)"),
        _adapter_check("jj", JjCli(Path.cwd()).version, MIN_JJ,
                       "install jj >= 0.46 (https://jj-vcs.github.io/jj/latest/install-and-setup/)"),
    ]
    git = find_git(child_path())
    checks.append(version_check(
        "git (for jj)", git_version(git or "git"), MIN_GIT_FOR_JJ,
        "jj needs git >= 2.42 first on the PATH ralph-dev gives it: install one beside jj "
        "(shared/tools/install-jj.sh does) or on PATH"))
    yours = find_git()
    checks.append(version_check(
        "git (yours, on PATH)", git_version(yours or "git"), (2, 0),
        "install git; ralph-dev leaves your repository readable by it"))
    names = [project] if project else project_names(config_path)
    if not names:
        checks.append(Check("config", False, f"no projects in {config_path}; "
                                             "run ralph-dev init PROJECT --repo PATH"))
    for name in names:
        try:
            settings = load(name)
        except ConfigError as exc:
            checks.append(Check(f"config {name}", False, str(exc)))
            continue
        checks.append(Check(f"config {name}", True, f"repo {settings.repo}"))
        checks += await project_checks(settings)
    return checks


async def project_checks(settings: ProjectSettings) -> list[Check]:
    name = settings.name
    checks = []
    if CLAUDE.name in {role_cli(settings, role) for role in Role}:
        checks.append(_claude_check(settings))
    if settings.agent.sandbox == "bwrap":
        checks.append(_sandbox_check(settings))
        checks.append(_network_check(settings))
    checks.append(_worker_check(settings))
    if settings.merge.mode == "pr":
        checks.append(version_check(
            f"gh ({name}, pull-request mode)", Gh(settings.merge.gh_bin, settings.repo).version(),
            (2, 0), "install the GitHub CLI and run `gh auth login` (or set merge.gh_bin)"))
    try:
        JjRepository.from_settings(settings).trunk.check_repo()
        checks.append(Check(f"repo {name}", True, f"{settings.repo} is a jj repo with "
                                                 f"bookmark {settings.trunk}"))
    except RalphError as exc:
        checks.append(Check(f"repo {name}", False, str(exc)))
    checks += _git_reads_repo(settings)
    checks.append(await _check_tracker(settings))
    if settings.cluster is not None:
        checks += cluster_checks(settings)
    return checks


def cluster_checks(settings: ProjectSettings) -> list[Check]:
    """A cluster project: Ray installed here, its cluster reachable, and each node with
    worker slots having what a worker runs with (asked on the node)."""
    name = f"cluster {settings.name}"
    try:
        from ralph_dev.hosts.ray.plane import RayPlane  # Ray only for a cluster
    except ImportError as exc:
        return [Check(name, False, f"Ray cannot be imported ({exc}): "
                                   "pip install 'ralph-dev[ray]'")]
    try:
        hosts = RayPlane.from_settings(settings).hosts(
            _agent_program(settings), sandboxed=settings.agent.sandbox == "bwrap")
    except (RalphError, ConnectionError) as exc:
        return [Check(name, False, f"{exc}; start the cluster (`ray start --head`, then "
                                   "`ray start --address=HEAD:6379 --resources="
                                   "'{\"ralph_worker\": 4}'` on each host) or fix "
                                   "cluster.address")]
    max_hosts = settings.cluster.max_hosts if settings.cluster is not None else None
    if not hosts and max_hosts is not None:
        return [Check(name, True, "no node has ralph_worker slots yet: Ray's autoscaler is "
                                  "asked for hosts as issues wait for one (cluster.max_hosts "
                                  f"= {max_hosts})")]
    if not hosts:
        return [Check(name, False, "no node has ralph_worker slots: join hosts with "
                                   "`ray start --address=HEAD:6379 --resources="
                                   "'{\"ralph_worker\": 4}'`, or, for a cluster whose "
                                   "autoscaler starts them, set cluster.max_hosts")]
    checks = [Check(name, True, f"{len(hosts)} nodes, {sum(h.slots for h in hosts)} "
                                "worker slots")]
    for host in hosts:
        where = f"node {host.host} ({host.node[:12]})"
        problems = ([f"missing {', '.join(host.missing)}: install them on that host (jj >= "
                     "0.46, tmux, util-linux's setpriv, bubblewrap)"] if host.missing else [])
        if host.sandbox is not None and "bwrap" not in host.missing:
            problems.append(f"cannot start a sandboxed worker: {host.sandbox}")
        checks.append(Check(where, not problems, f"{host.slots} slots; " + (
            "; ".join(problems) if problems else f"has {', '.join(sorted(host.tools))}")))
    return checks


def _agent_program(settings: ProjectSettings) -> str | None:
    """The program a worker's launch runs, as a host must have it (None: unknown here)."""
    if settings.agent.runner != COMMAND:
        try:
            return PROGRAMS[settings.agent.cli](settings, child_path())
        except AgentError:
            return PROFILES[settings.agent.cli].program
    words = shlex.split(settings.agent.command or "")
    return words[0] if words else None


def _claude_check(settings: ProjectSettings) -> Check:
    """The binary workers will really run (the same lookup), and its version."""
    name = f"claude ({settings.name})"
    try:
        claude = resolve_claude_bin(settings, child_path())
    except AgentError as exc:
        return Check(name, False, str(exc))
    check = version_check(name, claude_version(claude), (1, 0),
                          f"{claude} does not run: reinstall Claude Code (scripts/setup.sh)")
    return Check(name, check.ok, f"{check.detail} ({claude})" if check.ok else check.detail)


def _sandbox_check(settings: ProjectSettings) -> Check:
    """Workers run inside bubblewrap: it must be there and allowed to make a sandbox."""
    name = f"sandbox ({settings.name})"
    try:
        return Check(name, True, f"{try_sandbox()}: workers are confined")
    except AgentError as exc:
        return Check(name, False, str(exc))


def _network_check(settings: ProjectSettings) -> Check:
    """What a worker can reach (``agent.network``): ``open`` passes, said as the risk it
    is: a worker talked into it can send what it reads to any host."""
    name = f"network ({settings.name})"
    network = settings.agent.network
    if network == "open":
        return Check(name, True, "RISK: workers reach every host this machine reaches, so an "
                                 "agent talked into it can send the repository anywhere; set "
                                 "agent.network = \"allowlist\" (its API and "
                                 "agent.allow_hosts only) or \"none\"")
    if network == "none":
        return Check(name, True, "workers reach no host at all (agent.network = \"none\")")
    return Check(name, True, "workers reach only their agent's API and agent.allow_hosts, "
                             "through ralph-dev's egress proxy; refusals are events "
                             "(egress_refused)")


def _worker_check(settings: ProjectSettings) -> Check:
    """What a worker runs (ralph-dev's hooks and worker commands, the agent), run where a
    worker runs it: a sandbox that hides the install makes every worker fail."""
    name = f"workers ({settings.name})"
    try:
        version = try_worker_sandbox(settings)
    except RalphError as exc:
        return Check(name, False, str(exc))
    where = "in their sandbox" if settings.agent.sandbox == "bwrap" else "unconfined"
    if version:
        return Check(name, True, f"ralph-dev's hooks, worker commands and the agent run "
                                 f"{where} (agent: {version})")
    return Check(name, True, f"ralph-dev's hooks and worker commands run {where}, and the "
                             "agent can be started there (checked without running it)")


def _git_reads_repo(settings: ProjectSettings) -> list[Check]:
    """Both the person's git and jj's can open the repository (a colocated one)."""
    repo = settings.repo
    if not (repo / ".git").exists():
        return []
    newer = find_git(child_path())
    checks = []
    for label, git in (("yours", find_git()), ("jj's", newer)):
        if git is None or (label == "jj's" and git == find_git()):
            continue
        result = git_toplevel(repo, git)
        name = f"git {label} reads {settings.name}"
        if result.ok:
            checks.append(Check(name, True, f"{git} opens {repo}"))
            continue
        said = " ".join((result.stderr or result.stdout).split())[:200]
        fix = "see `git status` in it"
        if "relativeworktrees" in said.lower():
            fix = (f"an earlier ralph-dev (or `jj workspace add` by hand) made colocated "
                   f"workspaces, git worktrees that need git >= 2.48; when "
                   f"`{newer} -C {repo} worktree list` shows only {repo} (stop ralph-dev and "
                   f"let it forget them, or `jj workspace forget NAME`), run "
                   f"`{newer} -C {repo} config --unset extensions.relativeWorktrees`")
        checks.append(Check(name, False, f"{git} cannot open {repo} ({said}); {fix}"))
    return checks


async def _check_tracker(settings: ProjectSettings) -> Check:
    name = f"tracker {settings.name} ({settings.tracker.kind})"
    try:
        tracker = open_tracker(settings)
        try:
            issues = await tracker.list_issues()
        finally:
            await tracker.close()
    except RalphError as exc:
        return Check(name, False, str(exc))
    return Check(name, True, f"{len(issues)} issues readable")
