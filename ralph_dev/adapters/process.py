"""Running an outside command: the one runner, its one result, the one "raise if failed".

Every tool ralph-dev starts and waits for — jj, tmux, git, gh, bwrap, systemctl,
``claude --version`` — goes through :func:`run_command`: argv words only (never
a shell), stdin closed, a timeout, and a :class:`CommandResult` whatever
happened (a missing binary is exit 127, a timeout 124 with ``timed_out``).
Whether that is an error is the caller's call, made with
:meth:`CommandResult.check`, whose error carries the command (secrets
redacted), the tool's own words and its exit code. A tool that reads its own
failures more finely (jj's "interrupted", tmux's "not installed") passes a
classifier that picks the error class; the result stays this one type.

A timeout kills the child's whole process group (each command runs in a
session of its own), so a hung tmux client, or a jj and the git it started, is
not left behind when the caller stops waiting.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ralph_dev.core.environment import is_secret_name
from ralph_dev.core.errors import CommandError

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

REAP_SECONDS = 1.0
"""How long a killed command's output is still read. Something outside its process
group may hold its pipes open for good — a daemon it started, or a stopped tmux
server that the client handed its stdout and stderr to — so after that the pipes
are closed on our side and what they held is dropped."""


class CommandFailed(CommandError):
    """An outside command failed (the kind of error when no classifier picks another)."""


Classifier = Callable[["CommandResult", str], CommandError]
"""A failed result and a fix → the error to raise: how a tool's failures read."""


def command_failed(result: CommandResult, fix: str = "") -> CommandError:
    """The plain error of a failed command: the command, its words and ``fix``."""
    return CommandFailed(f"`{show_argv(result.argv, 200)}` failed ({result.how_it_ended}): "
                         f"{result.words}" + (f"; {fix}" if fix else ""),
                         command=result.argv, stderr=result.stderr, returncode=result.returncode)


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    """As run, with secret values redacted (:func:`redact_argv`): safe to log and show."""
    returncode: int
    stdout: str
    stderr: str
    cwd: str = ""
    timed_out: bool = False
    """The runner stopped waiting and killed it (``returncode`` is then 124)."""
    classify: Classifier = field(default=command_failed, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def interrupted(self) -> bool:
        """Killed by a signal or by the timeout: the tool gave no verdict of its own."""
        return self.timed_out or self.returncode < 0

    @property
    def how_it_ended(self) -> str:
        if self.timed_out:
            return "timed out"
        if self.returncode < 0:
            return f"killed by signal {-self.returncode}"
        return f"exit {self.returncode}"

    @property
    def words(self) -> str:
        """What the tool said about it (the end of stderr, else of stdout)."""
        return (self.stderr.strip() or self.stdout.strip() or "no output")[-500:]

    def check(self, fix: str = "") -> CommandResult:
        """Return self, or raise the error the result's classifier picks (a
        :class:`CommandFailed` by default) naming the command, its words and ``fix``
        (what a person can do about it)."""
        if self.ok:
            return self
        raise self.classify(self, fix)

    def lines(self) -> list[str]:
        """stdout's non-empty lines, split at newlines only (templates use \\x1e, \\x1f)."""
        return [line for line in self.stdout.split("\n") if line]

    def version(self) -> tuple[int, ...]:
        """The first ``N.N[.N]`` in the first line of the output (``--version`` calls)."""
        match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", self.first_line)
        return tuple(int(x) for x in match.groups() if x is not None) if match else ()

    @property
    def first_line(self) -> str:
        lines = (self.stdout or self.stderr).strip().splitlines()
        return lines[0] if lines else ""


def run_command(argv: Sequence[str], *, cwd: Path | None = None,
                env: Mapping[str, str] | None = None, timeout: float = 30.0,
                classify: Classifier = command_failed) -> CommandResult:
    """Run ``argv`` once and capture what it said; never raises for the command's failure.

    The command runs in a new session (so in a process group of its own, and
    with no controlling terminal to prompt on); after ``timeout`` seconds that
    whole group is killed and reaped before the result comes back. An exception
    while waiting (Ctrl-C) kills it too.
    """
    words = tuple(str(a) for a in argv)
    shown = redact_argv(words)
    where = str(cwd) if cwd is not None else ""

    def result(code: int, out: str, err: str, *, timed_out: bool = False) -> CommandResult:
        return CommandResult(shown, code, out, err, where, timed_out, classify)

    try:
        proc = subprocess.Popen(
            words, cwd=cwd, env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, errors="replace", start_new_session=True,
        )
    except FileNotFoundError as exc:
        missing = exc.filename if exc.filename is not None else words[0]
        return result(127, "", f"{missing}: does not exist")
    except OSError as exc:
        return result(126, "", str(exc))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = _kill(proc)
        return result(124, out, f"{err}did not answer within {timeout:g} s; stopped it",
                      timed_out=True)
    except BaseException:
        _kill(proc)
        raise
    return result(proc.returncode, out, err)


def _kill(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Kill the command's process group, reap it, and return what it had printed."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()  # the group is gone already; make sure of the child itself
    proc.wait()
    try:
        out, err = proc.communicate(timeout=REAP_SECONDS)
    except subprocess.TimeoutExpired:  # held open outside the group
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()
        return "", ""
    return out or "", err or ""


# --- showing a command without its secrets -----------------------------------------


def redact_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """argv with environment values hidden, since they may carry keys: tmux's
    ``-e NAME=VALUE``, bwrap's ``--setenv NAME VALUE``, and ``NAME=VALUE`` words (as
    ``env`` takes them) whose name sounds secret."""
    out: list[str] = []
    words = iter(argv)
    for word in words:
        name, eq, _ = word.partition("=")
        secret = eq and _ENV_NAME.fullmatch(name) and is_secret_name(name)
        out.append(f"{name}=<redacted>" if secret else word)
        if word == "-e" and (value := next(words, None)) is not None:
            out.append(value.partition("=")[0] + "=<redacted>")
        elif word == "--setenv" and (key := next(words, None)) is not None:
            out.append(key)
            if next(words, None) is not None:
                out.append("<redacted>")
    return tuple(out)


def show_argv(argv: Sequence[str], limit: int = 300) -> str:
    text = shlex.join(argv)
    return text if len(text) <= limit else text[: limit - 3] + "..."
