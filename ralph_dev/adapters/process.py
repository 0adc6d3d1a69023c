"""Running a short-lived outside command: the result object and the "raise if failed" step.

The tools ralph-dev calls now and then (gh, systemctl, git, claude --version)
go through :func:`run_command`, each from its own adapter module: argv words
only (never a shell), stdin closed, a timeout, and a :class:`CommandResult`
whatever happened — a missing binary is exit 127, a timeout 124. Whether that
is an error is the caller's call, made with :meth:`CommandResult.check`,
whose :class:`CommandFailed` carries the command and the tool's own words.
(jj and tmux, called on every tick, have their own richer sites.)
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ralph_dev.core.errors import CommandError


class CommandFailed(CommandError):
    """A short outside command (gh, systemctl, git…) failed."""


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def check(self, fix: str = "") -> CommandResult:
        """Return self, or raise :class:`CommandFailed` naming the command, its words and
        ``fix`` (what a person can do about it)."""
        if self.ok:
            return self
        words = (self.stderr.strip() or self.stdout.strip() or "no output")[-500:]
        raise CommandFailed(
            f"`{shlex.join(self.argv)[:200]}` failed (exit {self.returncode}): {words}"
            + (f"; {fix}" if fix else ""),
            command=self.argv, stderr=self.stderr, returncode=self.returncode,
        )

    def version(self) -> tuple[int, ...]:
        """The first ``N.N[.N]`` in the first line of the output (``--version`` calls)."""
        match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", self.first_line)
        return tuple(int(x) for x in match.groups() if x is not None) if match else ()

    @property
    def first_line(self) -> str:
        lines = (self.stdout or self.stderr).strip().splitlines()
        return lines[0] if lines else ""


def run_command(argv: Sequence[str], *, cwd: Path | None = None,
                env: Mapping[str, str] | None = None, timeout: float = 30.0) -> CommandResult:
    """Run ``argv`` once and capture what it said; never raises for the command's failure."""
    words = tuple(str(a) for a in argv)
    try:
        proc = subprocess.run(
            words, cwd=cwd, env=dict(env) if env is not None else None, capture_output=True,
            text=True, errors="replace", stdin=subprocess.DEVNULL, timeout=timeout, check=False,
        )
    except FileNotFoundError:
        return CommandResult(words, 127, "", f"{words[0]}: not found")
    except subprocess.TimeoutExpired:
        return CommandResult(words, 124, "", f"did not answer within {timeout:g} s")
    except OSError as exc:
        return CommandResult(words, 126, "", str(exc))
    return CommandResult(words, proc.returncode, proc.stdout, proc.stderr)
