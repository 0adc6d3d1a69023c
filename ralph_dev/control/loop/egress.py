"""What each worker's egress proxy refused and carried, heard by the controller.

A worker's proxy (``inpane.egress``) writes its refusals and each connection's bytes to
the worker's ``egress.jsonl``, outside the sandbox. Each tick this reads what is new:
every refusal becomes an ``egress_refused`` event (issue, host, port, why: on the
dashboard and in ``/metrics``), the bytes a worker sent and received since the last
tick an ``egress_bytes`` event, and the refusals of each running worker since it
started are counted for ``decide``, which tells the person about a worker that keeps
trying hosts it may not reach.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from ralph_dev.adapters.files import atomic_write_text, read_lines_from
from ralph_dev.adapters.store import StateStore
from ralph_dev.agent.egress import LEDGER, READ_MARK
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.model import WorkerRecord

READS_AFTER = 3
"""Ticks a worker's ledger is still read after its window went."""
READ_AT_MOST = 1 << 20
"""Ledger bytes read per worker and tick (a worker hammering refused hosts cannot make
a tick slow)."""


class EgressWatch:
    def __init__(self, settings: ProjectSettings, store: StateStore) -> None:
        self.settings = settings
        self.store = store
        self.refusals: dict[str, list[tuple[float, str]]] = {}
        """Per worker, each refusal read: when, and where it tried."""
        self.reads_left: dict[str, int] = {}

    def read(self, records: Mapping[str, WorkerRecord], windows: Iterable[str]
             ) -> dict[str, tuple[int, str]]:
        """Per running worker refused since its start: how often, and its last target.
        Read: the workers with a window, and a few ticks more those whose window went
        (what their proxy wrote as it ended)."""
        if self.settings.agent.network != "allowlist":
            return {}
        with_window = set(windows) & set(records)
        for name in with_window:
            self.reads_left[name] = READS_AFTER
        out: dict[str, tuple[int, str]] = {}
        for name in sorted(n for n, left in self.reads_left.items() if left > 0):
            record = records.get(name)
            if record is None:
                continue
            self._take(name, self.settings.paths.worker_dir(name))
            if name not in with_window:
                self.reads_left[name] -= 1
            started = record.started_at.timestamp() if record.started_at else 0.0
            since = [where for at, where in self.refusals.get(name, ()) if at >= started]
            if since and not record.done:
                out[name] = (len(since), since[-1])
        for gone in [n for n, left in self.reads_left.items() if left <= 0 or n not in records]:
            self.reads_left.pop(gone, None)
            self.refusals.pop(gone, None)
        return out

    def _take(self, name: str, worker_dir: Path) -> None:
        """What the worker's ledger gained since it was last read: the place read to is
        kept beside it (``egress.read``), so a restarted controller tells nothing twice."""
        mark = worker_dir / READ_MARK
        try:
            read_to = int(mark.read_text(encoding="ascii"))
        except (OSError, ValueError):
            read_to = 0
        ledger = worker_dir / LEDGER
        try:
            start = read_to if ledger.stat().st_size >= read_to else 0  # shorter: anew
        except OSError:  # nothing written yet: a worker's one connection is written at its end
            return
        lines, end = read_lines_from(ledger, start, READ_AT_MOST)
        if end == read_to:
            return
        sent = received = 0
        for line in lines:
            with contextlib.suppress(ValueError, TypeError, KeyError):
                entry = json.loads(line)
                if entry["kind"] == "refused":
                    host, port = str(entry["host"])[:253], int(entry["port"])
                    self.refusals.setdefault(name, []).append((float(entry["at"]),
                                                                f"{host}:{port}"))
                    self.store.append_event("egress_refused", issue=name, host=host,
                                            port=port, why=str(entry.get("why", ""))[:200],
                                            at=datetime.fromtimestamp(float(entry["at"]),
                                                                      UTC).isoformat())
                elif entry["kind"] == "bytes":
                    sent += max(0, int(entry["out"]))
                    received += max(0, int(entry["in"]))
        if sent or received:
            self.store.append_event("egress_bytes", issue=name, out_bytes=sent,
                                    in_bytes=received)
        with contextlib.suppress(OSError):
            atomic_write_text(mark, str(end))
