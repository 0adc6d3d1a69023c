"""A tracker outage, said once when it starts and once when it ends.

One ``tracker_unavailable`` event per failed tick buried the events log in copies of
the same sentence (hundreds in a few minutes) and made one outage look like many. So
the controller says it once it is sure — ``OUTAGE_TICKS`` failed reads in a row: a
single failed read is a glitch — and once more when the tracker answers again, with
how long it lasted and how many reads failed. A tracker that refuses ralph-dev (a
revoked key) is not an outage: its pause says so, once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from ralph_dev.adapters.store import StateStore
from ralph_dev.core.model import Observed

OUTAGE_TICKS = 3
"""Failed tracker reads in a row that make an outage worth saying."""


@dataclass
class TrackerOutage:
    store: StateStore
    clock: Callable[[], datetime]
    since: datetime | None = None
    failed: int = 0
    said: bool = False

    def saw(self, observed: Observed) -> None:
        """Note one tick's tracker read: the start and the end of an outage are events."""
        if observed.tracker_ok:
            if self.said and self.since is not None:
                self.store.append_event(
                    "tracker_recovered", seconds=round((self.clock() - self.since)
                                                       .total_seconds(), 1),
                    failed_calls=self.failed)
            self.since, self.failed, self.said = None, 0, False
            return
        self.since = self.since or self.clock()
        self.failed += 1
        if not self.said and self.failed >= OUTAGE_TICKS and not observed.tracker_refuses:
            self.store.append_event("tracker_unavailable", error=observed.tracker_error,
                                    since=self.since, failed_calls=self.failed)
            self.said = True
