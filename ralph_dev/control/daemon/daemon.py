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
import json
import os
import signal
import subprocess
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from ralph_dev.adapters.files import atomic_write_text
from ralph_dev.adapters.jj_cli import child_path
from ralph_dev.adapters.processes import (
    daemon_lock,
    kill_stale_controller,
    ralph_command,
    stop_controller_window,
)
from ralph_dev.adapters.sd_notify import SystemdNotifier
from ralph_dev.adapters.store import StateStore, from_iso, utcnow
from ralph_dev.adapters.wake import poke
from ralph_dev.agent.launch import launch_via_spec
from ralph_dev.agent.supervisor import start_supervisor
from ralph_dev.control.loop.config_watch import ConfigWatch, request_reload
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.environment import controller_environment, public_env
from ralph_dev.core.model import CONTROLLER_WINDOW, Window
from ralph_dev.core.paths import config_file
from ralph_dev.core.ports import Session

if TYPE_CHECKING:
    from ralph_dev.control.daemon.services import DaemonServices

log = structlog.get_logger(__name__)

WATCHDOG_MIN_S = 30.0
"""systemd's watchdog patience is three health intervals, never less than this (a
controller restart alone may wait 20 s for the old one to finish its action)."""


def health_interval(settings: ProjectSettings) -> float:
    """Seconds between the daemon's looks at its controller: ``timing.health_interval``,
    and on a cluster at most a quarter of its lease. A controller that died must be back
    and calling before its workers' hosts, having heard nothing for ¾ of the lease, stop
    their agents themselves."""
    every = settings.timing.health_interval
    if settings.cluster is not None:
        every = min(every, settings.cluster.lease / 4)
    return every


def child_environment(settings: ProjectSettings,
                      extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for processes the daemon starts in tmux panes (``core.environment``
    decides what passes). Panes inherit the tmux *server's* environment, not ours, so
    everything the controller needs is passed explicitly, with jj's git first on PATH."""
    env = controller_environment(os.environ, path=child_path(), config_file=str(config_file()),
                                 pass_env=settings.agent.pass_env)
    env.update(extra or {})
    return env












class Daemon:
    def __init__(self, settings: ProjectSettings, *, tmux: Session,
                 store: StateStore | None = None) -> None:
        self.settings = settings
        self.tmux = tmux
        self.store = store or StateStore(settings.paths)
        self.stop_event = asyncio.Event()
        self.stopping = threading.Event()
        """Set with ``stop_event``, for the threads restarting the controller."""
        self._controller_change = threading.Lock()
        """A restart and the final stop never interleave: the stop waits for a restart
        under way (which then opens no window), so nothing outlives the daemon."""
        self.started_controller_at: datetime | None = None
        self._backoff_announced = False
        self._supervisor: subprocess.Popen[bytes] | None = None
        self.notifier = SystemdNotifier()
        """systemd's Type=notify/WatchdogSec: ready once up, fed by each health check."""
        self.config = ConfigWatch(settings.name, config_file(), self.store, requests=False)
        """The daemon's own look at the config (the controller says what changed)."""
        self.services: DaemonServices | None = None

    # -- controller window --------------------------------------------------

    def controller_windows(self) -> list[Window]:
        return [w for w in self.tmux.list_windows() if w.name == CONTROLLER_WINDOW]

    def ensure_session(self) -> None:
        """The tmux session exists: made now if it is missing (first start, or the tmux
        server died, taking every window with it)."""
        if self.tmux.session_exists():
            return
        env = public_env(child_environment(self.settings))
        self.tmux.ensure_session(self.settings.repo, env)
        lost = sorted(r.issue for r in self.store.load_records().values() if r.running)
        for ident in lost:
            # a cause outside the issue: respawned without charging an attempt
            self.store.note_facts(ident, "daemon", lost="its tmux session went away",
                                  lost_at=utcnow())
        self.store.append_event("session_created", session=self.settings.session_name,
                                lost_workers=lost)
        log.info("session_created", lost_workers=lost)

    def start_controller(self, reason: str, *, planned: bool = False) -> None:
        """``planned``: a person's start (the daemon's own start, a service restart), not
        a crash: it does not count toward the crash-loop limit."""
        with self._controller_change:
            # SIGTERM first: let it finish its action; a frozen one is killed. So is one
            # that holds the lock without a window: either would make a new controller
            # exit at once.
            killed = stop_controller_window(self.tmux)
            killed += kill_stale_controller(self.store.paths.controller_lock,
                                            self.settings.name)
            for pid in killed:
                self.store.append_event("controller_killed", pid=pid,
                                        reason="it did not stop when asked and held the lock")
            if self.stopping.is_set():  # stopped while the old one was ending: no new one
                log.info("controller_start_skipped", reason="the daemon is stopping")
                return
            self._open_controller(reason, planned=planned)

    def _open_controller(self, reason: str, *, planned: bool) -> None:
        launch = launch_via_spec(
            ralph_command("controller", self.settings.name),
            child_environment(self.settings, {"RALPH_DEV_PROJECT": self.settings.name}),
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
        if not planned:
            self._record_restart()
        self.store.append_event("controller_start", reason=reason, planned=planned)
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

    def request_reload(self) -> None:
        """SIGHUP (``systemctl --user reload``, ``ralph-dev reload``): the controller reads
        the config at once, and so does the daemon (notifications, timing)."""
        request_reload(self.store)
        poke(self.store)
        self._read_config(force=True)

    def _read_config(self, *, force: bool = False) -> None:
        reloaded = self.config.check(self.settings, force=force)
        if reloaded is not None and reloaded.settings is not None:
            self.settings = reloaded.settings
            if self.services is not None:
                self.services.apply_settings(reloaded.settings)

    def request_stop(self) -> None:
        """SIGTERM, SIGINT: stop the loop, and any restart under way with it."""
        self.stopping.set()
        self.stop_event.set()

    async def health_check(self) -> None:
        try:
            await self._health_check()
        except asyncio.CancelledError:
            # the scheduler cancels a check still running when the daemon stops (say,
            # waiting for a frozen controller to end): a stop, not a failure
            if not self.stopping.is_set():
                raise
            log.info("health_check_stopped", reason="the daemon is stopping")

    async def _health_check(self) -> None:
        self.notifier.alive()  # a hung loop skips this, and systemd restarts the daemon
        self._read_config()
        if self._supervisor is not None:
            self._supervisor.poll()  # reap a finished supervisor (no zombie)
        try:
            await asyncio.to_thread(self.ensure_session)
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
        except Exception as exc:  # the loop must outlive any bad check, and say so
            log.exception("health_check_failed")
            self.store.append_event("health_check_failed", error=f"{type(exc).__name__}: {exc}")

    async def spawn_supervisor(self, why: str) -> None:
        """Hand an unhealthy swarm to the supervisor agent, once per crash loop."""
        from ralph_dev.control.state.status import snapshot
        from ralph_dev.control.state.text import render

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
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, self.request_reload)  # systemd's reload
        with daemon_lock(self.store.paths.daemon_pid):
            self.store.append_event("daemon_started", pid=os.getpid())
            scheduler = AsyncIOScheduler(job_defaults={"max_instances": 1, "coalesce": True})
            # dashboard, state API, metrics and notifications, beside the health loop
            from ralph_dev.control.daemon.services import DaemonServices

            self.services = services = DaemonServices(self.settings, self.store, self.tmux)
            try:
                await asyncio.to_thread(self.ensure_session)
                healthy, why = await asyncio.to_thread(self.controller_health)
                if not healthy or not any(w.alive for w in self.controller_windows()):
                    await asyncio.to_thread(self.start_controller, f"daemon start: {why}",
                                            planned=True)
                else:
                    self.started_controller_at = utcnow()  # its heartbeat is watched from now
                    self.store.append_event("controller_adopted", reason=why)
                interval = health_interval(self.settings)
                scheduler.add_job(self.health_check, "interval", seconds=interval,
                                  id="health")
                scheduler.start()
                await services.start()
                self.notifier.ready(f"watching the controller every {interval:g}s",
                                    watchdog_s=max(3 * interval, WATCHDOG_MIN_S))
                await self.stop_event.wait()
            finally:
                self.notifier.stopping()
                await services.stop()
                with contextlib.suppress(Exception):
                    scheduler.pause()
                    scheduler.shutdown(wait=False)
                await asyncio.to_thread(self.stop_controller)
                self.store.append_event("daemon_stopped", pid=os.getpid())

    def stop_controller(self, timeout: float = 20.0) -> None:
        """SIGTERM the controller (it finishes its current action), then close its window;
        after a restart under way, which sees the stop and starts nothing."""
        self.stopping.set()
        with self._controller_change:
            stop_controller_window(self.tmux, timeout)






