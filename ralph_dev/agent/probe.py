"""The workers' sandbox, tried for real before any worker depends on it.

A worker that cannot run ``ralph-dev`` (its hooks, its ``worker done``) or its agent
fails in ways that look like the worker's own fault: "command not found" in a pane,
a silent agent, attempts used up one after the other. So ``doctor``, ``start`` and the
controller run, through the pane's launcher and in the sandbox a worker gets (same
environment, same binds), ralph-dev's hook and worker entry points and the agent's
``--version``; a failure is a setup error naming the path and the fix.

The controller asks every tick (:class:`WorkerSetupCheck`), so the probe itself runs
once, then again only when something it ran from changed on disk (a file's identity
or mtime) or after a few minutes (sooner while it fails, to resume by itself).
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ralph_dev.adapters.jj_cli import child_path
from ralph_dev.adapters.process import CommandResult, run_command
from ralph_dev.agent.claude import AgentError
from ralph_dev.agent.launch import (
    agent_env,
    agent_home,
    agent_program,
    launch_via_spec,
    worker_sandbox,
)
from ralph_dev.agent.sandbox import bwrap_path
from ralph_dev.agent.toolchain import ralph_dev_script, worker_tools
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.environment import public_env

PROBE_TIMEOUT = 60.0
"""Seconds each probe may take (Claude Code starts in about one; a loaded machine)."""

FIX = ("ralph-dev binds its own installation and the agent (with the interpreter of a "
       "script) into the sandbox read-only, wherever they are; what the message names is "
       "missing, or needs something the sandbox hides (/tmp, /run, ralph-dev's own dirs, "
       "credentials): install it where it can be read (under your HOME, /opt, /usr/local), "
       "or set agent.sandbox = \"off\" to run workers unconfined. `ralph-dev doctor PROJECT` "
       "tries again")


@dataclass(frozen=True)
class Probe:
    name: str
    what: str
    """What a failure means, for the message: "ralph-dev's hooks cannot run"."""
    argv: tuple[str, ...]
    path: str
    """The file it runs from, named in the message."""
    ran: Callable[[CommandResult], bool]


def _exited_0(result: CommandResult) -> bool:
    return result.ok


def _was_executed(result: CommandResult) -> bool:
    """A ``command`` runner's agent need not know ``--version``: only whether it could be
    started counts (a shell's 126/127, bubblewrap's or the launcher's own refusal)."""
    said = result.stderr + result.stdout
    return result.returncode not in (126, 127) and "bwrap:" not in said \
        and "ralph-dev: cannot" not in said


def probes(settings: ProjectSettings, program: str) -> list[Probe]:
    """What a worker runs: ralph-dev as its hooks and skills call it (``ralph-dev`` on its
    PATH), and the agent."""
    script = ralph_dev_script()
    own = str(script) if script else f"no ralph-dev script beside {sys.executable} nor on PATH"
    agent_ran = _exited_0 if settings.agent.runner == "claude" else _was_executed
    return [
        Probe("hook", "ralph-dev's hooks cannot run", ("ralph-dev", "hook", "--help"), own,
              _exited_0),
        Probe("worker", "ralph-dev's worker commands cannot run",
              ("ralph-dev", "worker", "--help"), own, _exited_0),
        Probe("agent", "the agent cannot run", (program, "--version"), program, agent_ran),
    ]


def _said(result: CommandResult) -> str:
    """The probe's own words, without the launcher's "starting …" line."""
    lines = [line for line in (result.stderr + "\n" + result.stdout).splitlines()
             if line.strip() and not line.startswith("ralph-dev: starting ")]
    return " ".join(" ".join(lines).split())[:400] or f"exit {result.returncode}, no output"


def try_worker_sandbox(settings: ProjectSettings,
                       environ: Mapping[str, str] | None = None) -> str:
    """Run the probes in the sandbox a worker gets (or unconfined, as workers then run);
    returns the agent's version line, raises :class:`AgentError` with the path and fix."""
    environ = os.environ if environ is None else environ
    program = agent_program(settings, environ)
    probe_dir = settings.paths.state_dir / "probe"
    workspace = probe_dir / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    home = probe_dir / "home" if settings.agent.home == "isolated" \
        else agent_home(settings, environ)
    env = public_env(agent_env(settings, home=home, environ=environ))
    sandbox = worker_sandbox(settings, workspace=workspace, worker_dir=probe_dir, home=home,
                             environ=environ, program=program, path=env["PATH"])
    where = "in the workers' sandbox" if sandbox else "as workers run (agent.sandbox = off)"

    def run(probe: Probe) -> CommandResult:
        launch = launch_via_spec(probe.argv, env, workspace,
                                 probe_dir / f"{probe.name}.launch.json", sandbox=sandbox,
                                 issue=None, role="probe", attempt=0)
        return run_command(launch.argv, env=launch.env, cwd=workspace, timeout=PROBE_TIMEOUT)

    tried = probes(settings, program)
    with ThreadPoolExecutor(len(tried)) as pool:
        results = list(pool.map(run, tried))
    for probe, result in zip(tried, results, strict=True):
        if not probe.ran(result):
            raise AgentError(f"{probe.what} {where} ({probe.path}): `{shlex.join(probe.argv)}` "
                             f"failed: {_said(result)}; {FIX}")
    return results[-1].first_line if settings.agent.runner == "claude" else ""


Fingerprint = tuple[tuple[str, int, int], ...]


def fingerprint(settings: ProjectSettings, program: str,
                environ: Mapping[str, str] | None = None) -> Fingerprint:
    """The identity and mtime of everything the probe ran from: a change (a venv rebuilt,
    an agent installed or moved) means the last answer may no longer hold."""
    environ = os.environ if environ is None else environ
    path = child_path(base=environ.get("PATH", os.defpath))
    files = [*worker_tools(program, path), Path(program)]
    if settings.agent.sandbox == "bwrap":
        files.append(Path(bwrap_path()))
    out = []
    for file in files:
        try:
            st = file.stat()
        except OSError:
            out.append((str(file), -1, -1))
            continue
        out.append((str(file), st.st_ino, st.st_mtime_ns))
    return tuple(out)


class WorkerSetupCheck:
    """The controller's setup check, asked every tick: raises :class:`AgentError` (a
    ``RalphError``) while workers cannot start, which pauses dispatch and charges nobody.

    Finding the agent program is cheap and done every time; the probe is not, so it
    runs again only when :func:`fingerprint` changed or its answer is older than
    ``recheck_ok`` seconds (``recheck_failing`` while it fails)."""

    def __init__(self, *, recheck_ok: float = 300.0, recheck_failing: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.recheck_ok = recheck_ok
        self.recheck_failing = recheck_failing
        self.clock = clock
        self._last: tuple[Fingerprint, float, AgentError | None] | None = None

    def __call__(self, settings: ProjectSettings) -> None:
        """Checked with the settings in force (a config edit may change the agent)."""
        program = agent_program(settings)
        seen = fingerprint(settings, program)
        now = self.clock()
        if self._last is not None:
            last_seen, at, error = self._last
            wait = self.recheck_ok if error is None else self.recheck_failing
            if last_seen == seen and now - at < wait:
                if error is not None:
                    raise error
                return
        try:
            try_worker_sandbox(settings)
        except AgentError as exc:
            self._last = (seen, now, exc)
            raise
        self._last = (seen, now, None)
