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
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ralph_dev.adapters.files import read_tail
from ralph_dev.adapters.store import utcnow
from ralph_dev.core.environment import public_env

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
    command: str, cwd: Path, *, timeout: float = 1800.0, env: dict[str, str] | None = None,
    log_path: Path | None = None, wrapper: Sequence[str] = (),
) -> VerifyOutcome:
    """Run ``command`` in ``cwd``; a timeout or a missing shell is a failure, not a crash.

    ``wrapper``: an argv the shell runs under (the workers' sandbox, when the controller
    runs code workers wrote).

    With ``log_path`` the output is appended there as it comes (a worker's log, which
    ``ralph-dev logs`` follows) and the tail is read back from it.
    """
    started = utcnow().isoformat(timespec="seconds")
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        sink: Any = subprocess.PIPE
        offset = 0
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            sink = stack.enter_context(log_path.open("ab"))
            offset = sink.tell()
        try:
            # Its own process group, so a timeout kills everything the command forked
            # (test runners love to leave children behind).
            proc = subprocess.Popen(
                [*wrapper, "/bin/sh", "-c", command],
                cwd=cwd,
                # the command runs code agents wrote: it gets no API keys or secrets
                env=public_env(env if env is not None else os.environ),
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            code, output = 127, f"cannot run {command!r}: {exc}"
        else:
            code, output = _wait(proc, timeout)
            if log_path is not None:
                sink.flush()
                written, _ = read_tail(log_path, 0, min(sink.tell() - offset, 65536))
                output = written.decode("utf-8", "replace") + output
    tail = "\n".join(output.rstrip().splitlines()[-TAIL_LINES:])
    return VerifyOutcome(command, code, started, round(time.monotonic() - t0, 3), tail)


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, str]:
    """Exit code and captured output (empty when it went to a file); 124 on a timeout."""
    _RUNNING.add(proc.pid)
    try:
        raw, _ = proc.communicate(timeout=timeout)
        return proc.returncode, (raw or b"").decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raw, _ = proc.communicate()
        return 124, (raw or b"").decode("utf-8", "replace") + f"\n[timed out after {timeout}s]"
    finally:
        _RUNNING.discard(proc.pid)
