"""Run a project's verify command and keep the evidence.

The command comes from the project's own config (never from an issue), so it
runs through ``/bin/sh -c`` like a person would type it. The evidence
(command, exit code, time, duration, output tail) is what ``worker done``
comments on the issue and what a red trunk reports.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ralph_dev.core.environment import public_env
from ralph_dev.core.state import utcnow

TAIL_LINES = 40
_RUNNING: set[int] = set()
"""Process groups of verify commands still running in this process."""


def kill_running() -> None:
    """Kill every verify command this process started and has not reaped: they run
    in sessions of their own, so a dying controller would otherwise leave them."""
    for pgid in list(_RUNNING):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        _RUNNING.discard(pgid)


@dataclass(frozen=True)
class VerifyOutcome:
    command: str
    exit_code: int
    started_at: str
    duration_s: float
    output_tail: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def to_json(self) -> str:
        return json.dumps(asdict(self)) + "\n"


def run_verify(
    command: str, cwd: Path, *, timeout: float = 1800.0, env: dict[str, str] | None = None
) -> VerifyOutcome:
    """Run ``command`` in ``cwd``; a timeout or a missing shell is a failure, not a crash."""
    started = utcnow().isoformat(timespec="seconds")
    t0 = time.monotonic()
    try:
        # Its own process group, so a timeout kills everything the command forked
        # (test runners love to leave children behind).
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            cwd=cwd,
            # the command runs code agents wrote: it gets no API keys or secrets
            env=public_env(env if env is not None else os.environ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        code, output = 127, f"cannot run verify command: {exc}"
    else:
        _RUNNING.add(proc.pid)
        try:
            raw, _ = proc.communicate(timeout=timeout)
            code, output = proc.returncode, raw.decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raw, _ = proc.communicate()
            code = 124
            output = raw.decode("utf-8", "replace") + f"\n[timed out after {timeout}s]"
        finally:
            _RUNNING.discard(proc.pid)
    tail = "\n".join(output.rstrip().splitlines()[-TAIL_LINES:])
    return VerifyOutcome(command, code, started, round(time.monotonic() - t0, 3), tail)
