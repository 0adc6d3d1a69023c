"""A cluster worker's egress ledger, brought from its host to the controller's.

On one host a worker's egress proxy writes its refusals and bytes into the worker's
``egress.jsonl`` here, where ``control.loop.egress`` reads them. On a cluster the proxy
runs on the worker's host (beside its sandbox, as on one host), so its ledger is
written there; this copies what it gained into the worker's ledger here, whole lines at
a time, and the controller reads every worker's ledger the same way.

Where the copy has got to is kept beside it (``egress.carried``: the attempt, how far
into the host's ledger, and how long the copy here was then). A controller stopped
between appending and noting cuts the copy back to what it noted and brings the rest
again: nothing is told twice or lost.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ralph_dev.adapters.files import atomic_write_text
from ralph_dev.agent.egress import LEDGER

CARRIED = "egress.carried"
BRING_AT_MOST = 1 << 20
"""Bytes brought per call (a worker hammering refused hosts makes several calls, not
one huge one)."""

ReadLedger = Callable[[str, int, int, int], tuple[bytes, int]]
"""(issue, attempt, position, limit) → the whole lines the attempt's host ledger holds
from ``position`` on, and where they end there (past a line too long to carry, too)."""


@dataclass(frozen=True)
class Place:
    attempt: int
    there: int
    """Bytes of the host's ledger (the attempt's own) already copied."""
    here: int
    """The copy's length here once they were."""


class LedgerCopy:
    def __init__(self, worker_dir: Callable[[str], Path], read: ReadLedger) -> None:
        self.worker_dir = worker_dir
        self.read = read

    def bring(self, issue: str, attempt: int) -> int:
        """What the attempt's ledger gained on its host, appended here; how far that
        moved the copy on (0: nothing new)."""
        folder = self.worker_dir(issue)
        copy = folder / LEDGER
        place = self._place(folder, attempt, copy)
        data, end = self.read(issue, attempt, place.there, BRING_AT_MOST)
        if end <= place.there:
            return 0
        data = data[:data.rfind(b"\n") + 1]  # whole lines only, whatever the host sent
        with copy.open("ab") as handle:
            handle.truncate(place.here)  # what a stopped controller appended, not noted
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        self._note(folder, Place(attempt, end, place.here + len(data)))
        return end - place.there

    @staticmethod
    def _place(folder: Path, attempt: int, copy: Path) -> Place:
        try:
            noted = json.loads((folder / CARRIED).read_text(encoding="utf-8"))
            place = Place(int(noted["attempt"]), int(noted["there"]), int(noted["here"]))
        except (OSError, ValueError, KeyError, TypeError):
            place = None
        if place is not None and place.attempt == attempt:
            return place
        # a new attempt's host ledger starts empty: its lines go after all that is here
        try:
            here = copy.stat().st_size
        except OSError:
            here = 0
        return Place(attempt, 0, here)

    @staticmethod
    def _note(folder: Path, place: Place) -> None:
        atomic_write_text(folder / CARRIED, json.dumps(
            {"attempt": place.attempt, "there": place.there, "here": place.here}))
