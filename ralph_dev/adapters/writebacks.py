"""The queue of tracker writes owed to workers' accepted reports: one file each.

A worker's ``done``, ``blocked``, ``note`` and ``plan`` (and a groom worker's
``propose``, ``prioritize`` and ``flag``), once the controller accepted it, is kept
here (``state_dir/relay/ID.json``) until the actuator has made its tracker writes:
the queue is the controller's own, out of every worker's reach, and it outlives the
worker, its workspace and its record. A tracker outage of any length loses no report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from ralph_dev.adapters.files import atomic_write_text, private_dir
from ralph_dev.adapters.store import from_iso, to_iso
from ralph_dev.core.model import OwedWrite, check_identifier

log = structlog.get_logger(__name__)


@dataclass
class WriteBackItem:
    """One accepted report's tracker writes, waiting to be made."""

    id: str
    kind: str
    issue: str
    body: dict[str, Any]
    failures: int = 0
    failed_at: datetime | None = None
    last_error: str = ""
    blame: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "issue": self.issue, "body": self.body,
                "failures": self.failures, "failed_at": to_iso(self.failed_at),
                "last_error": self.last_error, "blame": self.blame}

    def owed(self) -> OwedWrite:
        return OwedWrite(id=self.id, kind=self.kind, issue=self.issue, failures=self.failures,
                         failed_at=self.failed_at, last_error=self.last_error,
                         blame=self.blame)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WriteBackItem:
        return cls(id=str(data["id"]), kind=str(data["kind"]),
                   issue=check_identifier(data["issue"]), body=dict(data["body"]),
                   # "attempts"/"next_at": the queue's format before one retry policy
                   failures=int(data.get("failures", data.get("attempts", 0))),
                   failed_at=from_iso(data.get("failed_at")),
                   last_error=str(data.get("last_error", "")), blame=str(data.get("blame", "")))


class WriteBackQueue:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, item_id: str) -> Path:
        return self.directory / f"{item_id}.json"

    def add(self, item: WriteBackItem) -> None:
        private_dir(self.directory)
        atomic_write_text(self.path(item.id), json.dumps(item.as_json()) + "\n")

    def get(self, item_id: str) -> WriteBackItem | None:
        return next((i for i in self.items() if i.id == item_id), None)

    def done(self, item_id: str) -> None:
        self.path(item_id).unlink(missing_ok=True)

    def items(self) -> list[WriteBackItem]:
        """Every item, oldest first; an unreadable file is logged and left alone."""
        out = []
        try:
            files = sorted(self.directory.glob("*.json"), key=lambda p: p.stat().st_mtime)
        except OSError:
            return []
        for path in files:
            try:
                out.append(WriteBackItem.from_json(json.loads(path.read_text(encoding="utf-8"))))
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("writeback_unreadable", path=str(path))
        return out

    def has(self, issue: str, kind: str) -> bool:
        return any(i.issue == issue and i.kind == kind for i in self.items())
