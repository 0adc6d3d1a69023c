"""The controller's two moments of pattern learning (``adapters.pattern_store``), made safe.

Learning is advice: a ledger that cannot be read or written (disk full, a bad
permission) is logged (and, for a plan, said in the events), and the relay item
or the tick that called goes on as if learning did not exist.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import structlog

from ralph_dev.adapters.pattern_store import remember_plan, settle_phases
from ralph_dev.adapters.store import StateStore
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import RalphError
from ralph_dev.core.model import Observed

log = structlog.get_logger(__name__)


def remember(settings: ProjectSettings, store: StateStore, phase: str, text: str,
             children: Iterable[str], now: datetime) -> None:
    """``remember_plan``, never failing the plan's relay."""
    try:
        remember_plan(settings, store, phase, text, list(children), now)
    except (RalphError, OSError, ValueError) as exc:
        log.warning("patterns_remember_failed", issue=phase, error=str(exc))
        store.append_event("patterns_failed", issue=phase, step="remember", error=str(exc))


def settle(settings: ProjectSettings, store: StateStore, observed: Observed,
           now: datetime) -> None:
    """``settle_phases`` for this tick's view, never failing the tick (logged only: it
    is tried again next tick, and an event every tick would drown the others)."""
    try:
        settle_phases(settings, store, observed, now)
    except (RalphError, OSError, ValueError) as exc:
        log.warning("patterns_settle_failed", error=str(exc))
