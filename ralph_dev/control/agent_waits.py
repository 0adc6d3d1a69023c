"""Agents that stopped on an API error wait out a swarm-wide pause, then go on.

A worker whose turn ended on a usage limit or an API outage (the ``stop-failure``
hook records it) is the swarm's problem, not its issue's: the controller pauses
dispatch (``core.agent_faults`` says for how long), so no attempt is charged,
nothing is killed and waiting workers are not nudged. When that pause ends the
controller presses Escape in each waiting worker's pane (Claude Code opens a
rate-limit menu) and types ``CONTINUE``: the same session goes on where it was.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from datetime import datetime, timedelta

import structlog

from ralph_dev.adapters.store import StateStore
from ralph_dev.core.agent_faults import (
    API_ACCESS,
    API_OUTAGE,
    OUTAGE_WAIT,
    USAGE_LIMIT,
    AgentFault,
    classify_stop_failure,
)
from ralph_dev.core.model import Pause, Window, WorkerRecord
from ralph_dev.core.ports import Panes

log = structlog.get_logger(__name__)

AGENT_PAUSES = (USAGE_LIMIT, API_OUTAGE, API_ACCESS)
DISMISS_SETTLE_S = 0.5
CONTINUE = ("The model API is available again (ralph-dev paused the swarm while it was "
            "not). Continue the task where you left off.")


class AgentWaits:
    def __init__(self, *, store: StateStore, tmux: Panes, clock: Callable[[], datetime],
                 outage_wait: timedelta = OUTAGE_WAIT) -> None:
        self.store = store
        self.tmux = tmux
        self.clock = clock
        self.outage_wait = outage_wait

    def _fault(self, record: WorkerRecord) -> AgentFault:
        assert record.agent_error is not None and record.agent_error_at is not None
        return classify_stop_failure(record.agent_error, record.agent_error_text or "",
                                     record.agent_error_at, outage_wait=self.outage_wait,
                                     streak=record.agent_error_streak)

    def pause_for_errors(self) -> None:
        """Turn API errors workers reported since their pause into (longer) pauses."""
        pauses = {p.kind: p for p in self.store.load_pauses()}
        for record in self.store.load_records().values():
            if record.agent_error is None or record.agent_error_at is None:
                continue
            fault = self._fault(record)
            if fault.until <= self.clock():
                continue  # waited out already: this worker is told to go on
            current = pauses.get(fault.kind)
            if current is not None and current.until is not None \
                    and current.until >= fault.until:
                continue  # already waiting at least that long
            pause = Pause(kind=fault.kind, cause=fault.cause, fix=fault.fix,
                          since=self.clock(), until=fault.until, quiet_workers=True)
            self.store.set_pause(pause)
            pauses[fault.kind] = pause
            log.warning("agent_api_pause", issue=record.issue, kind=fault.kind,
                        until=fault.until.isoformat())

    async def continue_waiting(self, windows: Collection[Window]) -> None:
        """After every agent pause has ended: each waiting worker goes on in its session."""
        if any(p.kind in AGENT_PAUSES for p in self.store.load_pauses()):
            return
        live = {w.name: w for w in windows if w.alive}
        due = []
        for record in self.store.load_records().values():
            if record.agent_error is None or record.agent_error_at is None:
                continue
            fault = self._fault(record)
            if fault.until > self.clock():
                continue  # reported after this tick's pauses were set: paused next tick
            due.append(record)
        panes = {r.issue: live[r.issue].pane_id for r in due if r.issue in live}
        for pane in panes.values():
            self.tmux.dismiss(pane)
        if panes:  # an Escape followed at once by text reads as Alt+key to a TUI
            await asyncio.sleep(DISMISS_SETTLE_S)
        for record in due:
            if record.issue in panes:
                self.tmux.send_text(panes[record.issue], CONTINUE)
                self.store.append_event("worker_continued", issue=record.issue,
                                        after=record.agent_error)
            self.store.update_record(record.issue, agent_error=None, agent_error_text=None,
                                     agent_error_at=None, last_activity=self.clock())
