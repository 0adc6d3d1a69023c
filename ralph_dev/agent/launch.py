"""Agent runners: how one worker's agent is started in its tmux window.

``build_launch`` turns (settings, issue, role, workspace, model) into a
``Launch``: the argv the tmux adapter runs (as argv words, never a shell
line), the explicit environment of the pane, the cwd and the prompt file.
Two promises shape it:

* **Issue text never reaches a shell.** The prompt goes only into a 0600 file.
  The window's command is always ``python -m ralph_dev.launcher SPEC``: a tiny
  wrapper that reads the launch spec (0600 JSON next to the prompt) and
  ``execve``s the agent. For ``claude`` it appends the prompt file's text as
  ONE argv element after ``--``. The ``command`` runner's template is split
  with ``shlex`` *before* ``{issue}``/``{role}``/``{workspace}``/``{prompt_file}``
  are filled in inside single argv elements; none of those is issue text, and
  the agent reads the prompt from ``{prompt_file}``.
* **The environment is the one asked for** (``core.environment`` decides it).
  tmux gives a new pane the PATH of the tmux client that created it, whatever
  ``-e PATH=…`` says, and Claude Code's hooks inherit claude's PATH, so the
  wrapper sets the launch's variables again (PATH with ``ralph-dev`` and jj's
  git first). Secrets travel only in a 0600 file the launcher deletes, never in
  argv or logs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import structlog

from ralph_dev.adapters.files import atomic_write_text, private_dir
from ralph_dev.adapters.jj_cli import child_path
from ralph_dev.adapters.pattern_store import plan_advice
from ralph_dev.adapters.processes import launcher_argv
from ralph_dev.adapters.store import utcnow
from ralph_dev.agent.can_start import problem as startable
from ralph_dev.agent.claude import (
    AgentError,
    claude_argv,
    plugin_dir,
    prepare_claude,
    resolve_claude_bin,
)
from ralph_dev.agent.codex import codex_argv, prepare_codex, resolve_codex_bin
from ralph_dev.agent.egress import network_plan
from ralph_dev.agent.gemini import gemini_argv, prepare_gemini, resolve_gemini_bin
from ralph_dev.agent.prompt import render_prompt, write_prompt
from ralph_dev.agent.sandbox import bwrap_path, on_this_host, sandbox_args, write_filter
from ralph_dev.agent.toolchain import ralph_dev_script, worker_tools
from ralph_dev.core.agent_profiles import PROFILES, AgentProfile, role_profile
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.environment import (
    CLAUDE_PREFIXES,
    NESTED_CLAUDE_VARS,
    RUN_DIR_VAR,
    agent_environment,
    split_secrets,
    verify_environment,
    worker_identity,
)
from ralph_dev.core.errors import ConfigError
from ralph_dev.core.model import Issue, Launch, Role, check_identifier

log = structlog.get_logger(__name__)

def agent_bin_dir(settings: ProjectSettings) -> Path | None:
    """A directory holding only a ``ralph-dev`` link, for the front of the agent's PATH.

    Putting the whole venv's bin first would also put its ``python`` first for
    the project's own commands; this puts exactly our ``ralph-dev`` there.
    """
    script = ralph_dev_script()
    if script is None:
        log.warning("ralph_dev_script_not_found", hint="hooks will not find `ralph-dev`")
        return None
    directory = settings.paths.data_dir / "agent-bin"
    directory.mkdir(parents=True, exist_ok=True)
    link = directory / "ralph-dev"
    target = str(script.resolve()) if script.is_symlink() else str(script)
    with contextlib.suppress(OSError):
        if str(link.readlink()) == target:
            return directory
    tmp = directory / f".ralph-dev.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.symlink_to(target)
    tmp.replace(link)
    return directory


def agent_home(settings: ProjectSettings, environ: Mapping[str, str]) -> Path:
    if settings.agent.home == "isolated":
        return settings.paths.agent_home
    if settings.agent.home == "user":
        home = environ.get("HOME") or str(Path.home())
        return Path(home)
    raise ConfigError(  # pragma: no cover - config validation refuses other values
        f"projects.{settings.name}.agent.home: expected 'user' or 'isolated', "
        f"got {settings.agent.home!r}"
    )


def agent_env(
    settings: ProjectSettings,
    *,
    home: Path,
    config_path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    profile: AgentProfile | None = None,
) -> dict[str, str]:
    """The environment every agent process of the project gets (``core.environment``
    decides what passes), with ``ralph-dev`` and jj's git first on PATH. ``profile``:
    the CLI it runs, whose own variables pass (None: the command runner's, Claude
    Code's as ever)."""
    environ = os.environ if environ is None else environ
    path = child_path(base=environ.get("PATH", os.defpath))
    bin_dir = agent_bin_dir(settings)
    if bin_dir is not None:
        path = os.pathsep.join([str(bin_dir), *(p for p in path.split(os.pathsep)
                                                if p and p != str(bin_dir))])
    return agent_environment(
        environ, project=settings.name, home=str(home), path=path,
        config_file=str(config_path) if config_path is not None else None,
        isolated_home=settings.agent.home == "isolated",
        pass_env=settings.agent.pass_env,
        provider=profile.env_prefixes if profile is not None else CLAUDE_PREFIXES,
    )


def worker_env(
    settings: ProjectSettings,
    identifier: str,
    role: Role,
    workspace: Path,
    *,
    attempt: int,
    home: Path,
    run_dir: Path,
    config_path: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The agent environment plus who the worker is, for the agent's own use (its skills
    name ``$RALPH_DEV_ISSUE``). ``ralph-dev worker …`` and the hooks do not trust these:
    they know the worker by its run directory (``adapters.mailbox``)."""
    env = agent_env(settings, home=home, config_path=config_path, environ=environ,
                    profile=role_profile(settings, role))
    env.update(worker_identity(issue=check_identifier(identifier), role=role.value,
                               workspace=str(workspace), attempt=attempt))
    env.update({
        # where an unconfined worker's commands find its run dir; a sandboxed one's
        # ignore it (theirs is at adapters.mailbox.RUN_MOUNT)
        RUN_DIR_VAR: str(run_dir),
        # Claude Code ends a turn after 8 Stop-hook blocks by default; ralph-dev's own
        # iteration cap (agent.iteration_cap) decides when a worker may stop instead.
        "CLAUDE_CODE_STOP_HOOK_BLOCK_CAP": str(settings.agent.iteration_cap + 1),
    })
    return env


def worker_home(settings: ProjectSettings, worker_dir: Path, environ: Mapping[str, str]) -> Path:
    """The HOME a worker's agent gets: its own (``agent.home = "isolated"``) or yours."""
    if settings.agent.home == "isolated":
        return worker_dir / "home"
    return agent_home(settings, environ)


def verify_env(settings: ProjectSettings, checkout: Path, *, issue: str | None,
               role: Role = Role.EXECUTE, attempt: int = 0,
               environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment the controller runs the verify command in: what ``worker done``'s
    verify had (``core.environment.verify_environment`` over the agent environment that
    issue's worker got, ``checkout`` its workspace). ``issue`` None: trunk's own verify,
    which belongs to no worker."""
    environ = os.environ if environ is None else environ
    if issue is None:
        base = agent_env(settings, home=agent_home(settings, environ), environ=environ)
        return verify_environment(base, project=settings.name, identity=None)
    worker_dir = settings.paths.worker_dir(issue)
    base = worker_env(settings, issue, role, checkout, attempt=attempt,
                      home=worker_home(settings, worker_dir, environ),
                      run_dir=worker_dir / "run", environ=environ)
    identity = worker_identity(issue=issue, role=role.value, workspace=str(checkout),
                               attempt=attempt)
    return verify_environment(base, project=settings.name, identity=identity)


def _trust_roots(settings: ProjectSettings, workspace: Path) -> list[Path]:
    """The workspace root (trust covers every workspace below it), as written and resolved."""
    root = settings.workspaces
    try:
        workspace.resolve().relative_to(root.resolve())
    except ValueError:
        root = workspace
    return list(dict.fromkeys([root, root.resolve()]))


PLACEHOLDERS = ("issue", "role", "workspace", "prompt_file")


_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def command_argv(template: str, values: Mapping[str, str]) -> list[str]:
    """Split ``template`` like a shell line, THEN fill placeholders inside each word.

    A value therefore always stays exactly one argv element, whatever it holds.
    """
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise ConfigError(f"agent.command {template!r} cannot be split into words: {exc}; "
                          "check its quotes") from exc
    if not words:
        raise ConfigError("agent.command is empty; set it to the agent's command line, e.g. "
                          "'my-agent --issue {issue} --prompt-file {prompt_file}'")
    out = []
    for word in words:
        def fill(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in values:
                raise ConfigError(
                    f"agent.command: unknown placeholder {{{name}}} "
                    f"(known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})"
                )
            return values[name]

        out.append(_PLACEHOLDER_RE.sub(fill, word))
    return out


LAUNCH_SPEC = ".launch.json"
"""How a launch spec's file name ends (next to its prompt file)."""


def sandbox_fit_here(spec_file: Path, person_home: Path) -> None:
    """A launch spec made on another host (a cluster's controller), its sandbox made fit
    for this one (``sandbox.on_this_host``): this host's secrets hidden, the other's
    left out, every path it binds checked here."""
    spec = json.loads(spec_file.read_text())
    sandbox = spec.get("sandbox")
    if not sandbox:
        return
    sandbox["args"] = on_this_host([str(a) for a in sandbox["args"]], person_home)
    atomic_write_text(spec_file, json.dumps(spec, indent=2) + "\n", mode=0o600)


def launch_via_spec(argv: Sequence[str], env: Mapping[str, str], cwd: Path, spec_file: Path,
                    *, prompt_file: Path | None = None, prompt_arg: bool = False,
                    sandbox: Mapping[str, Any] | None = None, **about: Any) -> Launch:
    """Start ``argv`` in a pane through ``python -m ralph_dev.launcher SPEC``.

    tmux replaces a new pane's PATH with the PATH of the tmux client that created
    it (spawn.c), whatever ``-e PATH=…`` says, so the wrapper sets the environment
    again from the spec. Secrets (API keys) never travel as ``tmux -e`` arguments,
    which ``ps`` shows: they go in a separate 0600 file that the wrapper reads and
    deletes before it execs the program.
    """
    public, secrets = split_secrets(env)
    spec: dict[str, Any] = {
        "argv": list(argv),
        "prompt_arg": prompt_arg,
        "cwd": str(cwd),
        "prompt_file": str(prompt_file) if prompt_file else None,
        "env": public,
        "unset": list(NESTED_CLAUDE_VARS),
        "sandbox": dict(sandbox) if sandbox else None,
        **about,
    }
    if secrets:
        secrets_file = spec_file.with_suffix(".secrets.json")
        atomic_write_text(secrets_file, json.dumps(secrets) + "\n", mode=0o600)
        spec["secrets_file"] = str(secrets_file)
    atomic_write_text(spec_file, json.dumps(spec, indent=2) + "\n", mode=0o600)
    return Launch(
        argv=launcher_argv(str(spec_file)),
        env=public,
        cwd=cwd,
        prompt_file=prompt_file,
        spec_file=spec_file,
    )


def agent_program(settings: ProjectSettings, environ: Mapping[str, str] | None = None) -> str:
    """The project's agent program (``agent.cli``'s, or ``agent.command``'s) as the workers'
    PATH finds it, once it could be started there: found, executable, its interpreter
    present (``agent.can_start``: files read, nothing run). Raises (naming the path and
    the fix) when it, or the CLI of some role (``roles.ROLE.cli``), cannot: a setup
    error, which pauses dispatch instead of charging attempts. Cheap enough for every
    tick."""
    environ = os.environ if environ is None else environ
    path = child_path(base=environ.get("PATH", os.defpath))
    if settings.agent.sandbox == "bwrap":
        bwrap_path()
    # every CLI some role runs must be there (``roles.ROLE.cli``), the project's own first
    used = sorted({profile.name for profile in map(partial(role_profile, settings), Role)
                   if profile is not None})
    found_clis = {name: PROGRAMS[name](settings, path) for name in used}
    if settings.agent.runner != "command":
        program = found_clis[settings.agent.cli]
        setting = f"agent.{PROFILES[settings.agent.cli].bin_setting}"
    else:
        program = command_argv(settings.agent.command or "", dict.fromkeys(PLACEHOLDERS, "x"))[0]
        setting = "agent.command"
        if os.sep not in program:
            found = shutil.which(program, path=path)
            if not found:
                raise AgentError(f"agent.command's program {program!r} is not an executable "
                                 "on the workers' PATH; install it or fix agent.command")
            program = found
    bad = startable(program, path)
    if bad is not None:
        raise AgentError(f"the agent cannot be started ({setting}): {bad}")
    return program


def _claude(settings: ProjectSettings, env: dict[str, str], home: Path, trust: Sequence[Path],
            role: Role, model: str, resume: str | None, workspace: Path
            ) -> tuple[list[str], str]:
    program = prepare_claude(settings, env, home, trust)
    return claude_argv(program, role, model, plugin=plugin_dir(),
                       extra_args=settings.agent.extra_args, resume=resume,
                       workspace=workspace), program


def _codex(settings: ProjectSettings, env: dict[str, str], home: Path, trust: Sequence[Path],
           role: Role, model: str, resume: str | None, workspace: Path
           ) -> tuple[list[str], str]:
    program = prepare_codex(settings, env, home, trust)
    # under its supervisor, which reads its events (``inpane.codex_exec``)
    return ["ralph-dev", "hook", "codex-exec", "--",
            *codex_argv(program, role, model, resume=resume, workspace=workspace)], program


def _gemini(settings: ProjectSettings, env: dict[str, str], home: Path, trust: Sequence[Path],
            role: Role, model: str, resume: str | None, workspace: Path
            ) -> tuple[list[str], str]:
    del workspace  # it works in its cwd, the workspace
    program = prepare_gemini(settings, env, home, trust)
    # under its supervisor, which gives it the prompt on stdin and reads its events
    # (``inpane.gemini_exec``)
    return ["ralph-dev", "hook", "gemini-exec", "--",
            *gemini_argv(program, role, model, resume=resume)], program


DRIVERS = {"claude": _claude, "codex": _codex, "gemini": _gemini}
"""Per agent CLI (``core.agent_profiles``), what readies its files and builds its argv
(without the prompt, which the launcher appends as the last word), and the agent's own
program (what its sandbox must hold)."""

PROGRAMS = {"claude": resolve_claude_bin, "codex": resolve_codex_bin,
            "gemini": resolve_gemini_bin}
"""Per agent CLI, how its program is found (its install check names the fix)."""


def check_agent(settings: ProjectSettings, environ: Mapping[str, str] | None = None) -> None:
    """Raise (naming the fix) when the project's agent program cannot be found."""
    agent_program(settings, environ)


def build_launch(
    settings: ProjectSettings,
    issue: Issue,
    role: Role,
    workspace: Path,
    model: str,
    *,
    attempt: int,
    worker_dir: Path | None = None,
    feedback: str | None = None,
    config_path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    resume_session: str | None = None,
    sent_back: str | None = None,
    stopped: str | None = None,
) -> Launch:
    """Prepare one worker: prompt file, environment, trusted HOME, and the window's argv.

    ``resume_session``: Claude Code continues that earlier conversation of this issue
    (``--resume``) instead of starting over; the prompt then says so. ``sent_back``:
    the verify output the issue's finished change failed with on top of trunk."""
    environ = os.environ if environ is None else environ
    identifier = check_identifier(issue.identifier)
    role = Role(role)
    workspace = Path(workspace)
    if config_path is None and environ.get("RALPH_DEV_CONFIG"):
        config_path = Path(environ["RALPH_DEV_CONFIG"])
    worker_dir = worker_dir or settings.paths.worker_dir(identifier)
    home = worker_home(settings, worker_dir, environ)
    env = worker_env(settings, identifier, role, workspace, attempt=attempt, home=home,
                     run_dir=worker_dir / "run", config_path=config_path, environ=environ)
    profile = role_profile(settings, role)
    resumed = resume_session if profile is not None and profile.resumes else None
    prompt = render_prompt(issue, role, workspace, attempt=attempt, feedback=feedback,
                           project=settings.name, resumed=resumed is not None,
                           sent_back=sent_back, stopped=stopped,
                           advice=plan_advice(settings, utcnow()) if role is Role.PLAN else "")
    prompt_file = write_prompt(settings, identifier, role, attempt, prompt)

    if profile is None:
        argv = command_argv(settings.agent.command or "", {
            "issue": identifier,
            "role": role.value,
            "workspace": str(workspace),
            "prompt_file": str(prompt_file),
        })
        program, prompt_arg = argv[0], False
    else:
        argv, program = DRIVERS[profile.name](settings, env, home,
                                              _trust_roots(settings, workspace), role, model,
                                              resumed, workspace.resolve())
        prompt_arg = True
    sandbox = worker_sandbox(settings, workspace=workspace, worker_dir=worker_dir,
                             home=home, environ=environ, program=program, path=env["PATH"],
                             readable=[prompt_file])
    network = network_plan(settings, worker_dir=worker_dir, issue=identifier,
                           profile=profile, env=env)
    if network is not None and sandbox is not None:
        sandbox = {**sandbox, "args": [*sandbox["args"], *network.bwrap_args]}
        argv = [*network.argv_prefix, *argv]
        env.update(network.env)
    log.info("agent_launch", issue=identifier, role=role.value,
             cli=profile.name if profile is not None else "command",
             model=model, attempt=attempt, home=settings.agent.home, program=Path(program).name,
             sandbox=settings.agent.sandbox, network=settings.agent.network)
    return launch_via_spec(argv, env, workspace, prompt_file.with_suffix(LAUNCH_SPEC),
                           prompt_file=prompt_file, prompt_arg=prompt_arg, sandbox=sandbox,
                           issue=identifier, role=role.value, attempt=int(attempt),
                           egress=network.egress if network is not None else None)


def worker_sandbox(settings: ProjectSettings, *, workspace: Path, worker_dir: Path, home: Path,
                   environ: Mapping[str, str], program: str, path: str,
                   readable: Sequence[Path] = ()) -> dict[str, Any] | None:
    """How the launcher confines this worker (``agent.sandbox``; None: unconfined): what
    it runs (ralph-dev, the agent ``program`` as its PATH ``path`` finds it) and
    ``readable`` are bound back wherever they are (``agent.toolchain``)."""
    if settings.agent.sandbox == "off":
        return None
    for own in ("tmp", "run"):
        private_dir(worker_dir / own)
    if settings.agent.home == "isolated":
        private_dir(home)
    else:
        (home / ".claude").mkdir(mode=0o700, exist_ok=True)
    person_home = Path(environ.get("HOME") or Path.home())
    bin_dir = agent_bin_dir(settings)
    tools = [*([bin_dir / "ralph-dev"] if bin_dir else []), *readable,
             *worker_tools(program, path)]
    args = sandbox_args(settings, workspace=workspace, worker_dir=worker_dir, agent_home=home,
                        person_home=person_home, tool_dirs=tools)
    seccomp = write_filter(worker_dir)
    return {"bwrap": bwrap_path(), "args": args, "seccomp": str(seccomp) if seccomp else None}
