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
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from ralph_dev.adapters.store import StateStore
from ralph_dev.agent.egress import LEDGER
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.model import WorkerRecord

READ_AT_MOST = 1 << 20
"""Ledger bytes read per worker and tick (a worker hammering refused hosts cannot make
a tick slow)."""


class EgressWatch:
    def __init__(self, settings: ProjectSettings, store: StateStore) -> None:
        self.settings = settings
        self.store = store
        self.read_to: dict[str, int] = {}
        self.refusals: dict[str, list[tuple[float, str]]] = {}
        """Per worker, each refusal read: when, and where it tried."""

    def read(self, records: Mapping[str, WorkerRecord]) -> dict[str, tuple[int, str]]:
        """Per running worker refused since its start: how often, and its last target."""
        if self.settings.agent.network != "allowlist":
            return {}
        out: dict[str, tuple[int, str]] = {}
        for name, record in records.items():
            self._take(name, self.settings.paths.worker_dir(name) / LEDGER)
            started = record.started_at.timestamp() if record.started_at else 0.0
            since = [where for at, where in self.refusals.get(name, ()) if at >= started]
            if since and not record.done:
                out[name] = (len(since), since[-1])
        for gone in set(self.read_to) - set(records):
            self.read_to.pop(gone, None)
            self.refusals.pop(gone, None)
        return out

    def _take(self, name: str, path: Path) -> None:
        try:
            with path.open("rb") as file:
                size = file.seek(0, 2)
                start = self.read_to.get(name, 0) if size >= self.read_to.get(name, 0) else 0
                file.seek(start)
                chunk = file.read(READ_AT_MOST)
        except OSError:
            return
        whole = chunk[:chunk.rfind(b"\n") + 1]
        self.read_to[name] = start + len(whole)
        sent = received = 0
        for line in whole.splitlines():
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
