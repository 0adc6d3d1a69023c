"""What the daemon runs beside its health loop: it follows the events log and serves it.

One follower reads the events log by offset every :data:`FOLLOW_INTERVAL`:
new events move the Prometheus counters, go to the dashboard's event stream,
and (after a merge or a trunk event) make trunk be read again. The state
document is rebuilt at most every :data:`PUSH_INTERVAL` while a dashboard is
connected (or when events arrive) and pushed to it. The notifier follows the
same log on its own offset (it persists where it got to). Everything runs as
tasks in the daemon's event loop; none of it may stop the health loop, so
each failure is logged and retried on the next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from ralph_dev.adapters.files import atomic_write_text
from ralph_dev.adapters.store import StateStore, utcnow
from ralph_dev.control.daemon.metrics import EventCounts, render_metrics
from ralph_dev.control.daemon.web.access import (
    LoginLinks,
    forget_login_key,
    generated_token,
    write_login_key,
)
from ralph_dev.control.state.sources import StateSources
from ralph_dev.control.state.status import heartbeat_health, snapshot, tracker_ttl
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.paths import config_file
from ralph_dev.core.ports import RemoteWorkers

log = structlog.get_logger(__name__)

FOLLOW_INTERVAL = 0.5
PUSH_INTERVAL = 2.0
EVENTS_IN_DOCUMENT = 50
TRUNK_EVENTS = frozenset({"merge", "trunk_red", "trunk_green", "pull_request"})
"""Events after which trunk is read again (it is cached otherwise)."""


class EventHub:
    """The dashboard's live connections: each gets a bounded queue; a reader too slow to
    keep up is dropped (its page reconnects and starts from a fresh document)."""

    def __init__(self, depth: int = 200) -> None:
        self.depth = depth
        self.queues: set[asyncio.Queue[tuple[str, Any] | None]] = set()

    def subscribe(self) -> asyncio.Queue[tuple[str, Any] | None]:
        queue: asyncio.Queue[tuple[str, Any] | None] = asyncio.Queue(self.depth)
        self.queues.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[tuple[str, Any] | None]) -> None:
        self.queues.discard(queue)

    def publish(self, kind: str, data: Any) -> None:
        for queue in list(self.queues):
            try:
                queue.put_nowait((kind, data))
            except asyncio.QueueFull:
                self.queues.discard(queue)
                with contextlib.suppress(asyncio.QueueFull):
                    queue.get_nowait()
                    queue.put_nowait(None)

    def close(self) -> None:
        for queue in list(self.queues):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)
        self.queues.clear()


class DaemonServices:
    """Dashboard, state API, metrics and notifications for one project's daemon."""

    def __init__(self, settings: ProjectSettings, store: StateStore, tmux: Any) -> None:
        self.settings = settings
        self.store = store
        self.tmux = tmux
        self.sources = StateSources(settings, tmux=tmux, issues_ttl=tracker_ttl(settings),
                                    trunk_ttl=60.0)
        self.counts = EventCounts()
        self.counts_offset = 0
        self._caught_up = False
        self.hub = EventHub()
        self.tick_histogram: dict[str, Any] | None = None
        self._document: tuple[float, dict[str, Any]] | None = None
        self._document_lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._cluster: RemoteWorkers | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.web: Any = None
        self.notifier: Any = None
        self.url: str | None = None
        self.started = False

    # -- life -------------------------------------------------------------------------

    def apply_settings(self, settings: ProjectSettings) -> None:
        """A config edit the daemon takes live (notifications, thresholds); the dashboard's
        own settings wait for a restart (``core.config.RESTART_NEEDED``)."""
        self.settings = settings
        self.sources.settings = settings
        if self.notifier is not None:
            self.notifier.settings = settings
        elif self.started:
            self._start_notifier()  # notifications were just set up

    async def start(self) -> None:
        """Start what is configured; a part that cannot start is reported and skipped."""
        self._every(FOLLOW_INTERVAL, self.follow, "follow_failed")
        self._every(PUSH_INTERVAL, self.push_state, "push_failed")
        await self._start_web()
        self._start_notifier()
        self.started = True

    async def stop(self) -> None:
        self._stop.set()
        self.hub.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.web is not None:
            await self.web.stop()
        (self.store.paths.state_dir / "web.json").unlink(missing_ok=True)
        forget_login_key(self.store.paths)
        with contextlib.suppress(Exception):  # the daemon still has to stop its controller
            await self.sources.close()

    def _every(self, interval: float, job: Callable[[], Awaitable[Any]], failed: str) -> None:
        async def loop() -> None:
            while not self._stop.is_set():
                try:
                    await job()
                except Exception:  # the health loop must outlive any of these
                    log.exception(failed)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), interval)

        self._tasks.append(asyncio.ensure_future(loop()))

    async def _start_web(self) -> None:
        from ralph_dev.control.daemon.web.server import (
            DashboardServer,
            WebError,
            is_loopback,
            read_token,
        )

        web_settings = self.settings.web
        if not web_settings.enabled:
            return
        paths = self.store.paths
        try:
            configured = read_token(web_settings)
            if configured is None and not is_loopback(web_settings.host):
                raise WebError(
                    f"web.host = {web_settings.host!r} is reachable from other machines, so "
                    "the dashboard needs an access token: set web.token_file (a chmod 600 "
                    "file) or RALPH_DEV_WEB_TOKEN, or serve on 127.0.0.1; not serving it")
            # a token always: on loopback too, workers share the host's network
            token = configured or generated_token(paths)
            logins = LoginLinks(write_login_key(paths))
            server = DashboardServer(self, web_settings, token, project=self.settings.name,
                                     logins=logins, configured=configured is not None)
            self.url = await server.start()
        except WebError as exc:
            forget_login_key(paths)
            log.error("web_disabled", error=str(exc))
            self.store.append_event("web_disabled", error=str(exc))
            atomic_write_text(paths.state_dir / "web.json",
                              json.dumps({"url": None, "error": str(exc),
                                          "pid": os.getpid()}) + "\n")
            return
        self.web = server
        auth = "configured token" if configured else "generated token (web-token)"
        atomic_write_text(paths.state_dir / "web.json", json.dumps(
            {"url": self.url, "auth": auth, "pid": os.getpid()}) + "\n")
        log.info("web_listening", url=self.url, auth=auth)
        self.store.append_event("web_listening", url=self.url, auth=auth)

    def _start_notifier(self) -> None:
        from ralph_dev.control.daemon.notifier import Notifier

        notify = self.settings.notify
        if not (notify.urls or notify.command):
            return
        self.notifier = Notifier(self.settings, self.store, lookup_issue=self.lookup_issue,
                                 deliver=self.deliver)
        self._every(1.0, self.notifier.poll, "notify_poll_failed")

    # -- the follower -------------------------------------------------------------------

    async def follow(self) -> None:
        if self.store.events_size() < self.counts_offset:
            self.counts.reset()  # the log was replaced: counters start over
            self.counts_offset = 0
        while True:
            events, offset = self.store.read_events_from(self.counts_offset)
            if offset == self.counts_offset:
                self._caught_up = True  # from now on, events are news for the dashboard
                return
            self.counts_offset = offset
            for event in events:
                self.counts.consume(event)
                if event.get("event") in TRUNK_EVENTS:
                    self.sources.forget_trunk()
                if self._caught_up:
                    self.hub.publish("ralph", event)
            if events and self._caught_up:
                self._document = None  # news: the next push rebuilds the document

    async def push_state(self) -> None:
        if self.hub.queues:
            self.hub.publish("state", await self.document(max_age=PUSH_INTERVAL / 2))

    async def document(self, *, max_age: float) -> dict[str, Any]:
        """The state document, rebuilt when older than ``max_age`` seconds."""
        loop = asyncio.get_running_loop()
        async with self._document_lock:
            if self._document is None or loop.time() - self._document[0] > max_age:
                doc = await snapshot(self.settings, events=EVENTS_IN_DOCUMENT,
                                     sources=self.sources)
                self._document = (loop.time(), doc)
            return self._document[1]

    async def fleet(self) -> dict[str, Any]:
        """Every configured project's state document, this one's from its cache (the
        others are read afresh: a fleet view is asked for now and then, not pushed)."""
        from ralph_dev.control.state.fleet import fleet_document

        return await fleet_document(config_file(), events=EVENTS_IN_DOCUMENT, own=(
            self.settings.name, lambda: self.document(max_age=1.0)))

    # -- what the server and the notifier ask ------------------------------------------

    def health(self) -> tuple[bool, str]:
        beat = self.store.read_heartbeat()
        return heartbeat_health(beat, self.settings.timing.heartbeat_stale, utcnow())

    async def metrics_text(self) -> bytes:
        await self.follow()  # counters exactly as of this scrape
        beat = self.store.read_heartbeat() or {}
        if isinstance(beat.get("tick_seconds"), dict):
            self.tick_histogram = beat["tick_seconds"]
        document = await self.document(max_age=5.0)
        return render_metrics(self.counts, document, self.tick_histogram)

    async def pane_tail(self, issue: str, lines: int) -> str | None:
        if self.settings.cluster is not None:  # a worker's screen is on its host
            return await asyncio.to_thread(self._cluster_screen, issue, lines)
        windows = await asyncio.to_thread(self.tmux.find, issue)
        if not windows:
            return None
        return await asyncio.to_thread(self.tmux.capture, windows[0].pane_id, lines)

    def _cluster_screen(self, issue: str, lines: int) -> str | None:
        from ralph_dev.control.loop.wiring import remote_workers_for
        from ralph_dev.core.errors import HostUnavailable

        if self._cluster is None:  # connected at the first look, and kept
            self._cluster = remote_workers_for(self.settings, self.store)
        try:
            return self._cluster.screen(issue, lines) if self._cluster else None
        except HostUnavailable:
            return None

    async def lookup_issue(self, identifier: str) -> Any:
        from ralph_dev.core.errors import TrackerError

        try:
            tracker = await self.sources.tracker()
            return await tracker.get(identifier)
        except TrackerError:
            return None

    async def deliver(self, message: Any) -> list[str]:
        from ralph_dev.adapters.notify import deliver

        notify = self.settings.notify
        return await asyncio.to_thread(deliver, message, notify.urls, notify.command)
