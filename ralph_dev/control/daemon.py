"""The daemon: keeps one project's controller alive, as a service.

It creates the tmux session, starts the controller in its own window, then
runs a health loop (apscheduler): is the controller window alive and its
heartbeat fresh? If not it restarts the window, backing off when restarts
pile up (a crash loop), and says so once. Workers are left alone on shutdown:
they are resumable, and the next controller adopts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import structlog

from ralph_dev.adapters.jj_cli import child_path
from ralph_dev.adapters.sd_notify import Notifier
from ralph_dev.agent.launch import launch_via_spec
from ralph_dev.agent.supervisor import start_supervisor
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.environment import controller_environment, public_env
from ralph_dev.core.errors import RalphError
from ralph_dev.core.fsutil import atomic_write_text, pid_lock
from ralph_dev.core.model import CONTROLLER_WINDOW, Window
from ralph_dev.core.paths import config_file
from ralph_dev.core.ports import Panes, Session
from ralph_dev.core.state import StateStore, from_iso, utcnow

log = structlog.get_logger(__name__)

WATCHDOG_MIN_S = 30.0
"""systemd's watchdog patience is three health intervals, never less than this (a
controller restart alone may wait 20 s for the old one to finish its action)."""


class DaemonRunning(RalphError):
    pass


def child_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for processes the daemon starts in tmux panes (``core.environment``
    decides what passes). Panes inherit the tmux *server's* environment, not ours, so
    everything the controller needs is passed explicitly, with jj's git first on PATH."""
    env = controller_environment(os.environ, path=child_path(), config_file=str(config_file()))
    env.update(extra or {})
    return env


def ralph_command(*args: str) -> list[str]:
    """argv that runs this very ralph-dev (same interpreter, same install)."""
    return [sys.executable, "-m", "ralph_dev", *args]


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


def read_daemon_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def daemon_running(path: Path) -> int | None:
    """The pid of the running daemon, judged by its lock (not by a stale pid file)."""
    if not path.exists():
        return None
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return read_daemon_pid(path) or -1
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


class Daemon:
    def __init__(self, settings: ProjectSettings, *, tmux: Session,
                 store: StateStore | None = None) -> None:
        self.settings = settings
        self.tmux = tmux
        self.store = store or StateStore(settings.paths)
        self.stop_event = asyncio.Event()
        self.started_controller_at: datetime | None = None
        self._backoff_announced = False
        self._supervisor: subprocess.Popen[bytes] | None = None
        self.notifier = Notifier()
        """systemd's Type=notify/WatchdogSec: ready once up, fed by each health check."""

    # -- controller window --------------------------------------------------

    def controller_windows(self) -> list[Window]:
        return [w for w in self.tmux.list_windows() if w.name == CONTROLLER_WINDOW]

    def start_controller(self, reason: str) -> None:
        stop_controller_window(self.tmux)  # SIGTERM first: let it finish its action
        launch = launch_via_spec(
            ralph_command("controller", self.settings.name),
            child_environment({"RALPH_DEV_PROJECT": self.settings.name}),
            self.settings.repo,
            self.store.paths.state_dir / "controller.launch.json",
        )
        try:
            self.tmux.open_window(
                CONTROLLER_WINDOW,
                cwd=launch.cwd,
                command=launch.argv,
                environment=launch.env,
                log_file=self.store.paths.logs_dir / "controller.log",
            )
        except BaseException:
            launch.discard_secrets()
            raise
        self.started_controller_at = utcnow()
        self._record_restart()
        self.store.append_event("controller_start", reason=reason)
        log.info("controller_start", reason=reason)

    def controller_health(self) -> tuple[bool, str]:
        """(healthy, why) from the controller window and its heartbeat."""
        windows = self.controller_windows()
        if not windows:
            return False, "no controller window"
        if not any(w.alive for w in windows):
            status = next((w.exit_status for w in windows), None)
            return False, f"controller exited (status {status})"
        beat = self.store.read_heartbeat()
        stale = timedelta(seconds=self.settings.timing.heartbeat_stale)
        now = utcnow()
        grace_from = self.started_controller_at or now
        if beat is None:
            if now - grace_from > stale:
                return False, "controller never wrote a heartbeat"
            return True, "starting"
        age = now - beat["time"]
        if age > stale and now - grace_from > stale:
            return False, f"heartbeat is {age.total_seconds():.0f}s old"
        return True, f"heartbeat {age.total_seconds():.0f}s old"

    # -- crash-loop backoff -------------------------------------------------

    def _restarts_file(self) -> Path:
        return self.store.paths.state_dir / "controller-restarts.json"

    def recent_restarts(self) -> list[datetime]:
        try:
            raw = json.loads(self._restarts_file().read_text())
        except (OSError, ValueError):
            return []
        window = timedelta(seconds=self.settings.timing.crash_loop_window)
        now = utcnow()
        times = [t for t in (from_iso(x) for x in raw if isinstance(x, str)) if t]
        return [t for t in times if now - t <= window]

    def _record_restart(self) -> None:
        times = [*self.recent_restarts(), utcnow()]
        atomic_write_text(self._restarts_file(), json.dumps([t.isoformat() for t in times]))

    def in_crash_loop(self) -> bool:
        return len(self.recent_restarts()) >= self.settings.timing.crash_loop_restarts

    # -- health loop --------------------------------------------------------

    async def health_check(self) -> None:
        self.notifier.alive()  # a hung loop skips this, and systemd restarts the daemon
        if self._supervisor is not None:
            self._supervisor.poll()  # reap a finished supervisor (no zombie)
        try:
            healthy, why = await asyncio.to_thread(self.controller_health)
            if healthy:
                self._backoff_announced = False
                return
            if self.in_crash_loop():
                if not self._backoff_announced:
                    self._backoff_announced = True
                    self.store.append_event(
                        "controller_crash_loop", reason=why,
                        restarts=len(self.recent_restarts()),
                        window_s=self.settings.timing.crash_loop_window,
                    )
                    log.error("controller_crash_loop", reason=why)
                    if self.settings.agent.supervisor:
                        await self.spawn_supervisor(why)
                return
            await asyncio.to_thread(self.start_controller, why)
        except Exception:
            log.exception("health_check_failed")

    async def spawn_supervisor(self, why: str) -> None:
        """Hand an unhealthy swarm to the supervisor agent, once per crash loop."""
        from ralph_dev.control.status import render, snapshot

        if self._supervisor is not None and self._supervisor.poll() is None:
            return  # one supervisor at a time
        text = render(await snapshot(self.settings, events=30))
        log_path = self.store.paths.logs_dir / "supervisor.log"
        self._supervisor = proc = start_supervisor(self.settings, text, reason=why,
                                                   log_path=log_path)
        self.store.append_event("supervisor_started", reason=why, pid=proc.pid,
                                log=str(log_path))

    async def run(self) -> None:
        from apscheduler.schedulers.asyncio import AsyncIOScheduler

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stop_event.set)
        with daemon_lock(self.store.paths.daemon_pid):
            self.store.append_event("daemon_started", pid=os.getpid())
            scheduler = AsyncIOScheduler(job_defaults={"max_instances": 1, "coalesce": True})
            try:
                env = public_env(child_environment())
                await asyncio.to_thread(self.tmux.ensure_session, self.settings.repo, env)
                healthy, why = await asyncio.to_thread(self.controller_health)
                if not healthy or not any(w.alive for w in self.controller_windows()):
                    await asyncio.to_thread(self.start_controller, f"daemon start: {why}")
                else:
                    self.started_controller_at = utcnow()  # its heartbeat is watched from now
                    self.store.append_event("controller_adopted", reason=why)
                scheduler.add_job(
                    self.health_check, "interval",
                    seconds=self.settings.timing.health_interval, id="health",
                )
                scheduler.start()
                interval = self.settings.timing.health_interval
                self.notifier.ready(f"watching the controller every {interval:g}s",
                                    watchdog_s=max(3 * interval, WATCHDOG_MIN_S))
                await self.stop_event.wait()
            finally:
                self.notifier.stopping()
                with contextlib.suppress(Exception):
                    scheduler.pause()
                    scheduler.shutdown(wait=False)
                await asyncio.to_thread(self.stop_controller)
                self.store.append_event("daemon_stopped", pid=os.getpid())

    def stop_controller(self, timeout: float = 20.0) -> None:
        """SIGTERM the controller (it finishes its current action), then close its window."""
        stop_controller_window(self.tmux, timeout)


def stop_controller_window(tmux: Panes, timeout: float = 20.0) -> None:
    for window in [w for w in tmux.list_windows() if w.name == CONTROLLER_WINDOW]:
        if window.alive and window.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(window.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and pid_alive(window.pid):
                time.sleep(0.1)
        tmux.kill_window(window.window_id)


def start_background(settings: ProjectSettings, timeout: float = 20.0) -> int:
    """Start ``ralph-dev start PROJECT --foreground`` detached; return its pid once it holds
    the lock (or raise with its log tail if it died)."""
    paths = settings.paths
    running = daemon_running(paths.daemon_pid)
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
        pid = daemon_running(paths.daemon_pid)
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
    pid = daemon_running(settings.paths.daemon_pid)
    if not pid or pid < 0:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not daemon_running(settings.paths.daemon_pid):
            return pid
        time.sleep(0.1)
    raise RalphError(f"daemon pid {pid} did not stop within {timeout:.0f}s")
