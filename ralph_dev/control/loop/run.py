"""The controller process: its lock, its run loop, its signals, its webhook listener.

``ralph-dev controller PROJECT`` (run by the daemon in the session's
``controller`` window) comes here: :func:`run` takes the project's controller
lock, builds the real adapters, optionally starts the Linear webhook listener
beside the loop, and ticks until asked to stop. Signals only set a flag or an
event; the loop checks them between ticks, and teardown is in ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from ralph_dev.adapters import wake as wake_protocol
from ralph_dev.adapters.files import pid_lock
from ralph_dev.adapters.verify import kill_running
from ralph_dev.adapters.webhook import WebhookError, WebhookListener, secret_from_env
from ralph_dev.control.loop.controller import Controller
from ralph_dev.core.errors import RalphError

log = structlog.get_logger(__name__)

QUICK_TICKS = 5
"""Ticks taken at once, without waiting for the poll, after actions that unblock more."""
DUE_LATENESS = 0.05
"""Seconds a tick taken for a due time comes after it, so the due time has passed by
the tick's clock."""

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""SIGHUP arrives when the window is killed."""


class ControllerLocked(RalphError):
    """Another controller already runs for this project."""


def controller_lock(path: Path) -> contextlib.AbstractContextManager[None]:
    """An OS lock so only one controller runs per project."""
    return pid_lock(path, lambda holder: ControllerLocked(
        f"a controller already runs for this project (pid {holder}, lock {path}); "
        "stop it first with `ralph-dev stop`"
    ))


def note(controller: Controller, event: str, **details: Any) -> None:
    """Append a loop event; a failure to write it (disk full, out of file descriptors)
    is logged and the loop goes on: the error path must never be what stops ticking."""
    try:
        controller.store.append_event(event, **details)
    except OSError as exc:
        log.error("event_write_failed", event_name=event, error=str(exc))


def until_next_tick(poll_interval: float, due: datetime | None,
                    clock: Callable[[], datetime]) -> float:
    """Seconds the loop waits for a wake: the poll, or less when something ends by itself
    sooner (a usage limit's reset is resumed at, not at the next poll after it)."""
    if due is None:
        return poll_interval
    return min(poll_interval, max(0.0, (due - clock()).total_seconds()) + DUE_LATENESS)


async def run_loop(controller: Controller, *, wake: asyncio.Event,
                   max_ticks: int | None = None) -> None:
    """Tick until asked to stop; a tick that unblocked work is followed at once by
    another (at most QUICK_TICKS in a row), else the loop waits for the poll or a wake."""
    loop = asyncio.get_running_loop()

    def request_stop() -> None:
        controller.stopping = True
        wake.set()

    for sig in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, request_stop)
    wake_protocol.install(loop, wake)  # people's tracker writes poke us
    controller.server.wake = wake.set  # workers' reports arrive on their sockets
    note(controller, "controller_started", pid=os.getpid())
    quick = 0  # ticks in a row taken at once; bounded so nothing can spin
    try:
        while not controller.stopping:
            again = False
            due: datetime | None = None
            try:
                result = await controller.tick()
                again, due = result.unblocked_work and quick < QUICK_TICKS, result.plan.due
            except Exception as exc:  # the loop must outlive any bad tick
                log.exception("tick_failed")
                note(controller, "tick_failed", error=repr(exc))
            if max_ticks is not None and controller.tick_number >= max_ticks:
                break
            if again:
                quick += 1
                continue
            quick = 0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), until_next_tick(
                    controller.settings.timing.poll_interval, due, lambda: controller.clock()))
            wake.clear()
    finally:
        kill_running()  # a trunk verify still running must not outlive us
        await controller.server.close()
        note(controller, "controller_stopped", pid=os.getpid(), tick=controller.tick_number)
        with contextlib.suppress(Exception):
            await controller.tracker.close()


async def run_with_webhooks(controller: Controller, *, max_ticks: int | None = None,
                            environ: Mapping[str, str] | None = None) -> None:
    """The loop, with the Linear webhook listener beside it when webhook_port is set.

    A listener that cannot start (no secret, port taken) is reported as an event
    and a warning, and the controller runs on polling alone: webhooks only speed
    ticks up, so they must never be the reason an unattended swarm stops.
    """
    settings = controller.settings
    wake = asyncio.Event()
    listener: WebhookListener | None = None
    port = settings.tracker.webhook_port
    if port is not None:
        try:
            listener = WebhookListener(secret_from_env(environ), wake,
                                       on_wake=controller.tracker.expect_changes)
            await listener.start(settings.tracker.webhook_host, port)
        except WebhookError as exc:
            listener = None
            log.warning("webhook_disabled", error=str(exc))
            note(controller, "webhook_disabled", error=str(exc))
        else:
            note(controller, "webhook_listening", host=settings.tracker.webhook_host,
                 port=listener.port)
    try:
        await run_loop(controller, wake=wake, max_ticks=max_ticks)
    finally:
        if listener is not None:
            await listener.stop()
