"""The workers' sandbox, tried for real before any worker depends on it.

A worker that cannot run ``ralph-dev`` (its hooks, its ``worker done``) or its agent
fails in ways that look like the worker's own fault: "command not found" in a pane,
a silent agent, attempts used up one after the other. So ``doctor``, ``start`` and the
controller run, through the pane's launcher and in the sandbox a worker gets (same
environment, same binds), ralph-dev's hook and worker entry points, and check that the
agent can be started there; a failure is a setup error naming the path and the fix.

The agent itself is never run for the ``command`` runner: a program there may do real
work whatever its arguments (an agent that works 30 s on ``--version`` held ``start``
30 s and did its work in the probe's workspace). Instead ``agent.can_start`` reads what
``execve`` would need (found, executable, a script's ``#!`` interpreter, an ELF's
loader), on the host and again inside the sandbox. Claude Code's ``--version`` is still
run (``claude`` runner): it shows Claude Code itself starts, and says which version.

Nothing waits on a slow probe: ``start`` skips the ``--version`` run (the controller
does it), and the controller's :class:`WorkerSetupCheck` runs the probe beside its loop
and hands each tick the last answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import structlog

from ralph_dev.adapters.jj_cli import child_path
from ralph_dev.adapters.process import CommandResult, run_command
from ralph_dev.adapters.processes import python_module
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
from ralph_dev.core.agent_profiles import COMMAND, PROFILES
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.environment import public_env
from ralph_dev.core.errors import RalphError

log = structlog.get_logger(__name__)

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


def probes(settings: ProjectSettings, program: str, *, run_agent: bool = True,
           sandboxed: bool = True) -> list[Probe]:
    """What a worker runs: ralph-dev as its hooks and skills call it (``ralph-dev`` on its
    PATH), and the agent: Claude Code's ``--version`` (``run_agent``), else only the check
    that it can be started, which runs ralph-dev's interpreter, never the agent, and is
    left out unconfined (the host's check said it all)."""
    script = ralph_dev_script()
    own = str(script) if script else f"no ralph-dev script beside {sys.executable} nor on PATH"
    tried = [
        Probe("hook", "ralph-dev's hooks cannot run", ("ralph-dev", "hook", "--help"), own),
        Probe("worker", "ralph-dev's worker commands cannot run",
              ("ralph-dev", "worker", "--help"), own),
    ]
    if run_agent and settings.agent.runner != COMMAND:  # a CLI's own version check
        profile = PROFILES[settings.agent.cli]
        tried.append(Probe("agent", "the agent cannot run", (program, *profile.version_args),
                           program))
    elif sandboxed:
        tried.append(Probe("start", "the agent cannot be started",
                           (*python_module("ralph_dev.agent.can_start"), program), program))
    return tried


def _said(result: CommandResult) -> str:
    """The probe's own words, without the launcher's "starting …" line."""
    lines = [line for line in (result.stderr + "\n" + result.stdout).splitlines()
             if line.strip() and not line.startswith("ralph-dev: starting ")]
    return " ".join(" ".join(lines).split())[:400] or f"exit {result.returncode}, no output"


def _start_problem(result: CommandResult) -> str | None:
    """What ``agent.can_start`` found in the sandbox (its JSON line), or None when it did
    not get to say (the sandbox or ralph-dev's interpreter failed first)."""
    for line in reversed(result.stdout.splitlines()):
        with contextlib.suppress(ValueError, TypeError, KeyError):
            return str(json.loads(line)["what"])
    return None


def _failure(settings: ProjectSettings, probe: Probe, result: CommandResult, where: str
             ) -> AgentError:
    setting = "agent.command" if settings.agent.runner == COMMAND \
        else f"agent.{PROFILES[settings.agent.cli].bin_setting}"
    if probe.name == "start" and (found := _start_problem(result)) is not None:
        # the host's own check passed: what is missing is what the sandbox hides
        return AgentError(f"{probe.what} {where} ({setting}): {found} there, while outside "
                          f"the sandbox it can be started: the sandbox hides what it needs; "
                          f"{FIX}")
    return AgentError(f"{probe.what} {where} ({probe.path}): `{shlex.join(probe.argv)}` "
                      f"failed: {_said(result)}; {FIX}")


def try_worker_sandbox(settings: ProjectSettings,
                       environ: Mapping[str, str] | None = None, *,
                       run_agent: bool = True) -> str:
    """Run the probes in the sandbox a worker gets (or unconfined, as workers then run);
    returns the agent's version line (Claude Code's, with ``run_agent``), raises
    :class:`AgentError` with the path and fix. The agent program is checked on the host
    first (:func:`agent_program`: cheap, and its message names the exact file)."""
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
    run_id = f"{os.getpid()}.{threading.get_ident()}.{os.urandom(3).hex()}"

    def run(probe: Probe) -> CommandResult:
        # a spec of its own: doctor, start and the controller may probe at once
        spec = probe_dir / f"{probe.name}.{run_id}.launch.json"
        launch = launch_via_spec(probe.argv, env, workspace, spec, sandbox=sandbox,
                                 issue=None, role="probe", attempt=0)
        try:
            return run_command(launch.argv, env=launch.env, cwd=workspace,
                               timeout=PROBE_TIMEOUT)
        finally:
            for leftover in (spec, spec.with_suffix(".secrets.json")):
                leftover.unlink(missing_ok=True)

    tried = probes(settings, program, run_agent=run_agent, sandboxed=sandbox is not None)
    with ThreadPoolExecutor(len(tried)) as pool:
        results = list(pool.map(run, tried))
    for probe, result in zip(tried, results, strict=True):
        if not result.ok:
            raise _failure(settings, probe, result, where)
    return results[-1].first_line if tried[-1].name == "agent" else ""


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


@dataclass(frozen=True)
class Answer:
    """One probe's answer, and what it was about."""

    about: tuple[object, ...]
    """The setup probed: :func:`fingerprint` and the settings the probe depends on."""
    at: float
    """When it came (the check's clock)."""
    error: AgentError | None
    number: int
    """Which probe it was: a later probe's answer is never replaced by an earlier one's."""


@dataclass(frozen=True)
class _Run:
    about: tuple[object, ...]
    number: int
    thread: threading.Thread


class WorkerSetupCheck:
    """The controller's setup check, asked every tick: raises :class:`AgentError` (a
    ``RalphError``) while workers cannot start, which pauses dispatch and charges nobody.
    It never waits for a probe.

    Each call checks the agent program on the host itself (:func:`agent_program`: found,
    executable, its interpreter there; a few stats and a read of its first bytes) and
    raises at once when that fails. The probe proper (:func:`try_worker_sandbox`: a few
    processes in the workers' sandbox, Claude Code's ``--version`` up to
    :data:`PROBE_TIMEOUT`) runs in a thread beside the loop, and each tick reads its last
    answer as a fact:

    * no answer yet (this controller's first probe still runs): workers may start. The
      host check passed, and ``start`` ran the same probe in the sandbox (but for
      ``--version``) before it started the daemon; holding every start for a probe that
      may take a minute would cost more than the rare setup broken only in the sandbox,
      which the first answer then pauses (a worker started meanwhile fails at once);
    * the last answer holds until the next one comes, also while a changed setup is
      probed anew: a broken setup stays paused until a probe says it is fixed, a working
      one keeps running (the host check still catches a program gone or broken);
    * it is probed anew at once when what it ran from changed on disk (a file's identity
      or mtime: a venv rebuilt, an agent installed or moved) or the settings it depends on
      changed (``agent.*``: another agent command), even while the probe of the old setup
      still runs; else after ``recheck_ok`` seconds (``recheck_failing`` while it fails,
      to resume by itself)."""

    def __init__(self, *, recheck_ok: float = 300.0, recheck_failing: float = 30.0,
                 clock: Callable[[], float] = time.monotonic,
                 probe: Callable[[ProjectSettings], object] = try_worker_sandbox) -> None:
        self.recheck_ok = recheck_ok
        self.recheck_failing = recheck_failing
        self.clock = clock
        self.probe = probe
        self._lock = threading.Lock()
        self._answer: Answer | None = None
        self._latest: _Run | None = None
        """The probe started last (running or done)."""

    def __call__(self, settings: ProjectSettings) -> None:
        """Checked with the settings in force (a config edit may change the agent)."""
        program = agent_program(settings)  # raises at once: the cheap part, every tick
        about = (fingerprint(settings, program), repr(settings.agent), str(settings.workspaces))
        with self._lock:
            answer, latest = self._answer, self._latest
            if latest is not None and latest.thread.is_alive():
                due = latest.about != about  # a changed setup is probed at once
            else:
                due = self._due(answer, about)
            if due:
                self._start(settings, about)
        if answer is not None and answer.error is not None:
            raise answer.error

    def _due(self, answer: Answer | None, about: tuple[object, ...]) -> bool:
        if answer is None or answer.about != about:
            return True
        wait = self.recheck_ok if answer.error is None else self.recheck_failing
        return self.clock() - answer.at >= wait

    def _start(self, settings: ProjectSettings, about: tuple[object, ...]) -> None:
        number = self._latest.number + 1 if self._latest is not None else 1
        thread = threading.Thread(target=self._probe, args=(settings, about, number),
                                  name=f"worker-setup-probe-{number}", daemon=True)
        self._latest = _Run(about, number, thread)
        thread.start()

    def _probe(self, settings: ProjectSettings, about: tuple[object, ...], number: int) -> None:
        """The probe, in its own thread; its answer replaces any earlier probe's."""
        began = time.monotonic()
        log.info("setup_probe_started", project=settings.name)
        error: AgentError | None = None
        try:
            self.probe(settings)
        except AgentError as exc:
            error = exc
        except (RalphError, OSError) as exc:
            error = AgentError(f"the workers' setup could not be tried: {exc}")
        except Exception as exc:  # a thread's failure must reach the tick, not vanish
            log.exception("setup_probe_crashed", project=settings.name)
            error = AgentError(f"the workers' setup probe failed ({exc!r}); the controller's "
                               "log has the trace, `ralph-dev doctor` tries it by hand")
        log.info("setup_probe_answered", project=settings.name, ok=error is None,
                 seconds=round(time.monotonic() - began, 2),
                 error=str(error) if error else None)
        with self._lock:
            if self._answer is None or self._answer.number < number:
                self._answer = Answer(about, self.clock(), error, number)

    def settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the probe started last to answer (tests;
        the tick never waits): whether it has."""
        with self._lock:
            latest = self._latest
        if latest is not None:
            latest.thread.join(timeout)
        return latest is None or not latest.thread.is_alive()
