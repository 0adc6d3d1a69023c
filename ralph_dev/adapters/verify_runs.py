"""Verify commands that run beside the controller, each in a process of its own.

The merge lane's verifies take as long as a project's test suite does; the controller
must go on ticking meanwhile. So a verify is started detached (:func:`start`): a small
runner (``python -m ralph_dev.adapters.verify_runs RUN_DIR``, in a session of its own)
runs the command and keeps everything about it in ``RUN_DIR``, the way a worker's pane
keeps its log and exit status:

* ``spec.json`` — the argv, directory, environment and timeout (written first);
* ``lock`` — held (``flock``) by the runner for as long as it lives: a run whose lock
  can be taken has no runner any more, whatever pid a later process got;
* ``group`` — the command's process group and its start time (to end a command whose
  runner was killed under it, and never a stranger that reused the number);
* ``output.log`` — what the command printed;
* ``exit.json`` — its exit status, written (atomically) before the runner lets go of
  the lock: its presence is the outcome, read by any controller, this one or the next.

Nothing here is in memory only: a controller killed mid-verify finds the run still
going (and waits for it), or finished (and reads it), or lost (and starts it again).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ralph_dev.adapters.files import atomic_write_text, private_dir, read_tail
from ralph_dev.adapters.processes import python_module
from ralph_dev.core.environment import public_env
from ralph_dev.core.errors import RalphError

SPEC, LOCK, GROUP, OUTPUT, EXIT = "spec.json", "lock", "group", "output.log", "exit.json"
TAIL_LINES = 40
DEFAULT_TIMEOUT = 1800.0

RunState = Literal["running", "passed", "failed", "lost"]


@dataclass(frozen=True)
class RunStatus:
    """What one run's directory says now."""

    state: RunState
    exit_code: int | None = None
    duration_s: float | None = None
    finished_at: str | None = None


# -- the controller's side ---------------------------------------------------------------

_STARTED: dict[str, subprocess.Popen[bytes]] = {}
"""Runners this process started and has not reaped yet (a finished child is reaped the
next time its run is read; one adopted from an earlier controller is init's to reap)."""


def start(run_dir: Path, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str],
          timeout: float = DEFAULT_TIMEOUT, wake: Path | None = None) -> None:
    """Start ``argv`` in ``cwd`` beside the caller and return at once. ``wake``: the
    controller's heartbeat file; the controller it names is poked (``adapters.wake``) the
    moment the outcome is written, so it ticks then instead of at its next poll."""
    private_dir(run_dir)
    spec = {"argv": list(argv), "cwd": str(cwd), "env": public_env(dict(env)),
            "timeout": timeout, "wake": str(wake) if wake else None}
    atomic_write_text(run_dir / SPEC, json.dumps(spec) + "\n")
    runner_env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL",
                                                                "PYTHONPATH", "HOME")}
    proc = subprocess.Popen(
        python_module("ralph_dev.adapters.verify_runs", str(run_dir)),
        cwd=run_dir, env=runner_env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=(run_dir / "runner.log").open("ab"), start_new_session=True, close_fds=True)
    _STARTED[str(run_dir)] = proc
    # the runner takes its lock at once; until it has, the run must not look lost
    deadline = time.monotonic() + 10.0
    while not _locked(run_dir) and not (run_dir / EXIT).exists() \
            and time.monotonic() < deadline:
        if proc.poll() is not None:
            if (run_dir / EXIT).exists():
                return  # done already
            said = (run_dir / "runner.log").read_text(errors="replace")[-2000:]
            raise RalphError(f"the verify runner could not start (exit {proc.returncode}): "
                             f"{said.strip() or 'no output'}")
        time.sleep(0.005)


def status(run_dir: Path) -> RunStatus:
    """The run's state: its outcome once written, else running while its runner lives,
    else lost (the runner died without an outcome: killed, or the host rebooted)."""
    proc = _STARTED.get(str(run_dir))
    if proc is not None and proc.poll() is not None:
        _STARTED.pop(str(run_dir), None)  # reaped
    outcome = _read_json(run_dir / EXIT)
    if outcome is not None:
        code = outcome.get("exit_code")
        code = code if isinstance(code, int) else 1
        return RunStatus("passed" if code == 0 else "failed", code,
                         outcome.get("duration_s"), outcome.get("finished_at"))
    if _locked(run_dir):
        return RunStatus("running")
    if _read_json(run_dir / EXIT) is not None:  # it finished between the two reads
        return status(run_dir)
    return RunStatus("lost")


def output_tail(run_dir: Path, lines: int = TAIL_LINES) -> str:
    raw, _ = read_tail(run_dir / OUTPUT, 0, 65536)
    return "\n".join(raw.decode("utf-8", "replace").rstrip().splitlines()[-lines:])


def stop(run_dir: Path) -> None:
    """End the run (its runner and its command's process group), if it still runs."""
    group = _read_json(run_dir / GROUP)
    proc = _STARTED.pop(str(run_dir), None)
    runner = _read_json(run_dir / "runner.json")
    if runner is not None and _locked(run_dir):
        _kill_group(int(runner.get("pgid", 0)), runner.get("started"))
    if group is not None:
        _kill_group(int(group.get("pgid", 0)), group.get("started"))
    if proc is not None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def _locked(run_dir: Path) -> bool:
    """Whether a live runner holds the run's lock."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock we took
    return False


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _start_time(pid: int) -> str | None:
    """The process's start time (Linux: ``/proc/PID/stat`` field 22), None elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def _kill_group(pgid: int, started: str | None) -> None:
    if pgid <= 1:
        return
    now = _start_time(pgid)
    if started is not None and now is not None and now != started:
        return  # the number was reused: not ours
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


# -- the runner's side -----------------------------------------------------------------


def _run(run_dir: Path) -> int:
    lock = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 3  # another runner has it: never two of one run
    me = os.getpid()
    atomic_write_text(run_dir / "runner.json", json.dumps({"pgid": os.getpgid(0),
                                                           "started": _start_time(me)}))
    spec = json.loads((run_dir / SPEC).read_text())
    timeout = float(spec.get("timeout") or DEFAULT_TIMEOUT)
    t0 = time.monotonic()
    stopping = False

    def terminate(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, terminate)
    with (run_dir / OUTPUT).open("ab") as out:
        try:
            proc = subprocess.Popen(spec["argv"], cwd=spec["cwd"], env=spec["env"],
                                    stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            out.write(f"cannot run {spec['argv'][-1]!r}: {exc}\n".encode())
            code = 127
        else:
            atomic_write_text(run_dir / GROUP, json.dumps(
                {"pgid": proc.pid, "started": _start_time(proc.pid)}))
            code = _wait(proc, timeout, out, lambda: stopping)
    if stopping:
        return 143  # stopped: no outcome (the run is replaced)
    atomic_write_text(run_dir / EXIT, json.dumps({
        "exit_code": code, "duration_s": round(time.monotonic() - t0, 3),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())}) + "\n")
    if spec.get("wake"):
        _wake(Path(spec["wake"]))
    return 0


def _wake(heartbeat: Path) -> None:
    """Poke the controller the heartbeat names (best effort: else its poll finds it)."""
    from ralph_dev.adapters.wake import poke_pid

    beat = _read_json(heartbeat)
    poke_pid(beat.get("pid") if beat else None)


def _wait(proc: subprocess.Popen[bytes], timeout: float, out: Any,
          stopping: Any) -> int:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        if stopping() or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if not stopping():
                out.write(f"\n[timed out after {timeout:g}s]\n".encode())
            return 124


if __name__ == "__main__":
    sys.exit(_run(Path(sys.argv[1])))
