"""One controller tick: observe → decide → act, and the heartbeat.

Level-triggered: each tick re-reads the tracker, tmux (one call) and jj, plus
ralph-dev's own records, and asks the pure ``decide`` what to do; the actuator
(``control.act``) carries it out. Nothing important is kept in memory between
ticks, so killing the controller at any moment and starting it again converges to
the same place.

Failures are separated the controller-runtime way: a tracker that cannot be read
skips dispatch for this tick (workers keep running); an action that fails is
recorded where the one failure policy says (``core.policy``) and ``decide`` takes
it from there at the next tick.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog

from ralph_dev.adapters.accounts import AccountPauses, AccountWindows, KeyProbe, account_of
from ralph_dev.adapters.store import StateStore, utcnow
from ralph_dev.adapters.writebacks import WriteBackQueue
from ralph_dev.control.daemon.metrics import TickHistogram
from ralph_dev.control.loop.act import Actuator
from ralph_dev.control.loop.config_watch import ConfigWatch
from ralph_dev.control.loop.costs import Spending
from ralph_dev.control.loop.intake import Intake
from ralph_dev.control.loop.merging import MergeLane
from ralph_dev.control.loop.observe import Observer, SetupCheck
from ralph_dev.control.loop.tracker_outage import TrackerOutage
from ralph_dev.control.loop.tripwires import Tripwires
from ralph_dev.control.loop.worker_dirs import WorkerDirs
from ralph_dev.core.actions import (
    Action,
    Complete,
    EndPause,
    Forget,
    Hold,
    Kill,
    Merge,
    Plan,
    Reap,
    Resume,
    VerifyTrunk,
    WriteBack,
)
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.decide import decide
from ralph_dev.core.decide.swarm import write_backs
from ralph_dev.core.errors import RalphError
from ralph_dev.core.model import Observed, worker_windows
from ralph_dev.core.paths import config_file
from ralph_dev.core.ports import (
    AgentLauncher,
    PullRequests,
    Repository,
    Tracker,
    WorkerHost,
    WorkerMailboxes,
)

log = structlog.get_logger(__name__)

_UNBLOCKING = (Merge, Forget, Complete, Reap, Kill, Resume, Hold, EndPause, VerifyTrunk,
               WriteBack)
"""Actions whose success may let another action go at once (a merge frees dependents,
a reaped or killed window or a lifted hold frees a respawn, a written-back done moves
its issue on)."""


@dataclass
class TickResult:
    tick: int
    plan: Plan
    observed: Observed
    failures: list[tuple[Action, str]] = field(default_factory=list)

    @property
    def unblocked_work(self) -> bool:
        failed = {id(a) for a, _ in self.failures}
        return any(isinstance(a, _UNBLOCKING) and id(a) not in failed
                   for a in self.plan.actions)


class Controller:
    """Owns one tick; adapters are injected (``control.wiring`` builds the real ones)."""

    def __init__(
        self,
        settings: ProjectSettings,
        *,
        tracker: Tracker,
        host: WorkerHost,
        jj: Repository,
        launcher: AgentLauncher,
        pull_requests: PullRequests,
        store: StateStore | None = None,
        clock: Callable[[], datetime] = utcnow,
        agent_check: SetupCheck | None = None,
        accounts: AccountPauses | None = None,
    ) -> None:
        self.settings = settings
        self.tracker = tracker
        self.host = host
        self.jj = jj
        self.store = store or StateStore(settings.paths)
        self.clock = clock
        self.tick_number = 0
        self.stopping = False
        self.tick_seconds = TickHistogram()  # published in the heartbeat for /metrics
        self.writebacks = WriteBackQueue(settings.paths.relay_dir)
        self.dirs = WorkerDirs(settings, store=self.store, jj=host.changes)
        # the account its agents run on, as this process's environment gives them keys
        accounts = accounts or AccountPauses(account_of(settings, os.environ), settings.name)
        windows = AccountWindows(accounts.account, accounts.directory)
        key_probe = KeyProbe.of(settings, windows, self.store, os.environ)
        self.intake = Intake(settings, store=self.store, dirs=self.dirs,
                             writebacks=self.writebacks, jj=host.changes, tracker=tracker,
                             windows=windows)
        self.server: WorkerMailboxes = host.mailboxes(self.dirs.run_dir, self.intake.hear,
                                                      self._host_attempt)
        self.merges = MergeLane(settings, jj=jj, store=self.store,
                                pull_requests=pull_requests)
        self.tripwires = Tripwires(settings, self.store, config=config_file(), clock=clock)
        self.outage = TrackerOutage(self.store, self.clock)
        self.observer = Observer(settings, tracker=tracker, host=host, jj=jj, store=self.store,
                                 writebacks=self.writebacks, dirs=self.dirs, merges=self.merges,
                                 tripwires=self.tripwires, spending=Spending(settings, clock),
                                 setup_check=agent_check, clock=clock, accounts=accounts,
                                 windows=windows, key_probe=key_probe)
        self.actuator = Actuator(settings, tracker=tracker, host=host, launcher=launcher,
                                 store=self.store, dirs=self.dirs, intake=self.intake,
                                 server=self.server, merges=self.merges,
                                 writebacks=self.writebacks, clock=clock, beat=self._beat_while,
                                 acted_on=self.tripwires.controller_acted, accounts=accounts,
                                 key_probe=key_probe)
        self.intake.write_now = self._write_now
        self.config = ConfigWatch(settings.name, config_file(), self.store)
        self._waits: dict[str, Any] | None = None

    def _host_attempt(self, name: str) -> int:
        record = self.store.load_record(name)
        return record.host_attempt if record is not None else 0

    def apply_settings(self, settings: ProjectSettings) -> None:
        """Run with ``settings`` from now on: every part reads them from the next tick."""
        self.settings = settings
        for part in (self.dirs, self.intake, self.merges, self.tripwires, self.observer,
                     self.observer.spending, self.actuator, self.actuator.writer):
            part.settings = settings
        self.observer.config_loaded_at = self.clock()

    def _read_config(self) -> None:
        """A person's edit of the config applies from this tick (``control.config_watch``);
        an invalid one is said once and changes nothing."""
        reloaded = self.config.check(self.settings)
        if reloaded is None:
            return
        if reloaded.settings is None:
            log.error("config_invalid", error=reloaded.error)
            self.store.append_event("config_invalid", file=str(self.config.path),
                                    error=reloaded.error,
                                    why="the last good config keeps running")
            return
        self.apply_settings(reloaded.settings)
        self.store.append_event("config_reloaded", file=str(self.config.path),
                                changed=reloaded.changed,
                                restart_needed=reloaded.restart_needed)
        log.info("config_reloaded", changed=reloaded.changed,
                 restart_needed=reloaded.restart_needed)

    async def _write_now(self, report: str) -> str | None:
        """A report just accepted: its tracker writes now, when ``decide``'s rule says
        they are due (a worker's command waits for the answer)."""
        item = self.writebacks.get(report)
        if item is None:
            return None
        for action in write_backs((item.owed(),), True, self.settings, self.clock()):
            error = await self.actuator.writer.write_back(action.report)
            if error is not None:
                return str(error)
        return None

    def _beat_while(self, acting: str) -> None:
        # the whole beat, not a part of it: /metrics reads tick_seconds from the file
        self.store.write_heartbeat(tick=self.tick_number, acting=acting,
                                   tick_seconds=self.tick_seconds.as_json(),
                                   config_error=self.config.error,
                                   restart_needed=self.config.restart_needed)

    # -- tick ---------------------------------------------------------------------------

    async def tick(self) -> TickResult:
        self.tick_number += 1
        started = time.monotonic()
        structlog.contextvars.bind_contextvars(tick=self.tick_number)
        try:
            self._read_config()
            await self.server.listen(self.dirs.names())
            await self.intake.accept_all()  # reports written while we were busy or stopped
            observed = await self.observer.observe()
            self.outage.saw(observed)
            plan = decide(observed, self.settings, self.clock())
            self._publish_waits(plan)
            # before acting: the projects sharing this host see what it runs and wants
            self.host.publish(plan.load, worker_windows(observed.windows))
            if plan.slots_wanted is not None:
                await self._want_slots(plan.slots_wanted)
            result = TickResult(self.tick_number, plan, observed)
            result.failures = await self.actuator.carry_out(
                plan, observed, stopping=lambda: self.stopping,
                before=lambda action: self.write_heartbeat(observed, plan, acting=action.kind))
            self.tick_seconds.observe(time.monotonic() - started)
            self.write_heartbeat(observed, plan)
            return result
        finally:
            structlog.contextvars.unbind_contextvars("tick")

    async def _want_slots(self, count: int) -> None:
        """The cluster's autoscaler asked for room for ``count`` workers; a cluster that
        does not answer is asked again next tick (its slots are what they are)."""
        try:
            await asyncio.to_thread(self.host.want_slots, count)
        except RalphError as exc:
            log.warning("slots_not_asked", slots=count, error=str(exc))

    def _publish_waits(self, plan: Plan) -> None:
        """What each issue the plan leaves alone waits on, for ``status`` and the
        dashboard (written when it changes)."""
        waits = {ident: wait.as_json() for ident, wait in sorted(plan.waits.items())}
        if waits != self._waits:
            self.store.write_waits(waits)
            self._waits = waits

    def write_heartbeat(self, observed: Observed, plan: Plan, *,
                        acting: str | None = None) -> None:
        live = [w for w in worker_windows(observed.windows) if w.alive]
        self.store.write_heartbeat(
            tick=self.tick_number,
            workers=len(live),
            issues=len(observed.issues),
            actions=len(plan.actions),
            tracker_ok=observed.tracker_ok,
            tracker_usage=self.tracker.usage(),
            acting=acting,
            tick_seconds=self.tick_seconds.as_json(),
            config_error=self.config.error,
            restart_needed=self.config.restart_needed,
            account=observed.account or None,
        )
