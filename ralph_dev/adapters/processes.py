"""ralph-dev's own long-lived processes, as other processes see them.

Whether a daemon or a controller runs is judged by its OS lock (``flock``),
never by a pid file alone: the kernel drops the lock when the process dies,
even by ``kill -9``. Starting the daemon in the background, stopping it, and
stopping (or, when frozen, killing) a controller live here, so the CLI, the
daemon and the service share one way of doing each.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import structlog

from ralph_dev import launcher
from ralph_dev.adapters.files import pid_lock
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import RalphError
from ralph_dev.core.model import CONTROLLER_WINDOW
from ralph_dev.core.paths import config_file
from ralph_dev.core.ports import Panes

log = structlog.get_logger(__name__)


class DaemonRunning(RalphError):
    pass


def python_module(module: str, *args: str) -> list[str]:
    """argv that runs ``module`` of this very ralph-dev (same interpreter, same install),
    never of the directory it starts in: ``python -m`` puts that directory first on
    ``sys.path`` unless ``-P`` says not to, and a worker's workspace holding a
    ``ralph_dev/`` of its own would run its code outside its sandbox (a pane's launcher
    starts there, with the launch's secrets)."""
    return [sys.executable, "-P", "-m", module, *args]


def launcher_argv(*args: str) -> list[str]:
    """argv that runs the pane launcher (``ralph_dev/launcher.py``) of this very ralph-dev
    by its path, isolated and without ``site``: a pane's Python starts in ~10 ms, not
    ~25, before it execs the agent, and no variable or directory of the pane's can
    change what it imports."""
    return [sys.executable, "-I", "-S", launcher.__file__, *args]


def ralph_command(*args: str) -> list[str]:
    """argv that runs this very ralph-dev (same interpreter, same install)."""
    return python_module("ralph_dev", *args)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped by tmux) has ended."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True  # no /proc: trust kill(0)
    return "\nState:\tZ" not in status


def daemon_lock(path: Path) -> contextlib.AbstractContextManager[None]:
    """Held for the daemon's whole life; a second ``start`` names the holder's pid."""
    return pid_lock(path, lambda holder: DaemonRunning(
        f"ralph-dev is already running for this project (daemon pid {holder}); "
        "see `ralph-dev status`, or stop it with `ralph-dev stop`"
    ))


def read_lock_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def lock_holder(path: Path) -> int | None:
    """The pid holding a ralph-dev lock (daemon or controller), judged by the lock itself
    (not by a stale pid file); -1 when held by a process that wrote no pid."""
    if not path.exists():
        return None
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return read_lock_pid(path) or -1
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def stop_controller_window(tmux: Panes, timeout: float = 20.0) -> list[int]:
    """SIGTERM the controller (it finishes its current action); one that does not end in
    ``timeout`` (frozen, stopped) is killed; then its window is closed. Returns the pids
    that had to be killed."""
    killed = []
    for window in [w for w in tmux.list_windows() if w.name == CONTROLLER_WINDOW]:
        if window.alive and window.pid and not end_process(window.pid, timeout):
            killed.append(window.pid)
        tmux.kill_window(window.window_id)
    return killed


def end_process(pid: int, timeout: float) -> bool:
    """SIGTERM, then SIGKILL after ``timeout`` (a stopped process ignores SIGTERM).
    True when SIGTERM was enough."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if _wait_gone(pid, timeout):
        return True
    log.warning("process_killed", pid=pid, after_s=timeout)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _wait_gone(pid, 10.0)
    return False


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def kill_stale_controller(lock: Path, project: str) -> list[int]:
    """Kill the process that holds ``project``'s controller lock, if it is one of our
    controllers (never a stranger whose pid was reused); its pid, if any.

    Called when a new controller is about to start: the old one's window is gone
    or was closed, so whoever still holds the lock is frozen or orphaned, and would
    make every new controller exit "already runs".
    """
    holder = lock_holder(lock)
    if not holder or holder < 0 or not _is_controller_of(holder, project):
        return []
    end_process(holder, 2.0)
    return [holder]


def _is_controller_of(pid: int, project: str) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"controller" in argv and project.encode() in argv and any(
        b"ralph_dev" in arg or arg.endswith(b"ralph-dev") for arg in argv)


def start_background(settings: ProjectSettings, timeout: float = 20.0) -> int:
    """Start ``ralph-dev start PROJECT --foreground`` detached; return its pid once it holds
    the lock (or raise with its log tail if it died)."""
    paths = settings.paths
    running = lock_holder(paths.daemon_pid)
    if running:
        raise DaemonRunning(
            f"ralph-dev is already running for {settings.name!r} (daemon pid {running}); "
            "see `ralph-dev status`, or stop it with `ralph-dev stop`"
        )
    paths.logs_dir.mkdir(parents=True, exist_ok=True)
    log_file = paths.logs_dir / "daemon.log"
    with log_file.open("ab") as out:
        proc = subprocess.Popen(
            ralph_command("--config", str(config_file()), "start", settings.name, "--foreground"),
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
            env={**os.environ,
                 "RALPH_DEV_LOG_LEVEL": os.environ.get("RALPH_DEV_LOG_LEVEL", "INFO")},
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = lock_holder(paths.daemon_pid)
        if pid:
            return pid
        if proc.poll() is not None:
            tail = log_file.read_text(errors="replace").splitlines()[-10:]
            raise RalphError(
                f"the daemon exited at start (code {proc.returncode}); {log_file}:\n"
                + "\n".join(tail)
            )
        time.sleep(0.05)
    raise RalphError(f"the daemon did not start within {timeout:.0f}s; see {log_file}")


def stop_daemon(settings: ProjectSettings, *, timeout: float = 30.0) -> int | None:
    """SIGTERM the daemon and wait for its lock to be released. Returns its pid."""
    pid = lock_holder(settings.paths.daemon_pid)
    if not pid or pid < 0:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not lock_holder(settings.paths.daemon_pid):
            return pid
        time.sleep(0.1)
    raise RalphError(f"daemon pid {pid} did not stop within {timeout:.0f}s")
