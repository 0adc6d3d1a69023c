"""The swarm's spend, kept up to date each tick, and the budgets that stop it.

``costs.json`` in the project's state dir holds, per issue and role, the tokens and
estimated dollars its workers spent (it outlives their records and workspaces), the
dollars per UTC day, and how far each transcript was read: each tick reads only what
Claude Code appended since (``core.costs``). An issue past ``costs.issue_usd`` or
``costs.issue_tokens`` has its worker stopped and is held with the figures; a day past
``costs.day_usd`` pauses dispatch until the next UTC midnight (both ``decide``'s rules:
this module only counts).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from ralph_dev.adapters.files import atomic_write_text, read_lines_from
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.costs import Usage, over_budget, read_transcript
from ralph_dev.core.model import WorkerRecord

log = structlog.get_logger(__name__)

READ_AT_MOST = 8 * 2**20
"""Transcript bytes read per worker per tick (a long backlog is read over a few ticks)."""


def ledger_path(settings: ProjectSettings) -> Path:
    return settings.paths.state_dir / "costs.json"


def load(settings: ProjectSettings) -> dict[str, Any]:
    try:
        data = json.loads(ledger_path(settings).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    for key in ("issues", "days", "read"):
        if not isinstance(data.get(key), dict):
            data[key] = {}
    return data


def issue_spend(data: Mapping[str, Any], issue: str) -> Usage:
    """Everything the issue's workers spent, all roles and attempts together."""
    total = Usage()
    for usage in (data["issues"].get(issue) or {}).values():
        total = total + Usage.from_json(usage)
    return total


class Spending:
    def __init__(self, settings: ProjectSettings, clock: Callable[[], datetime]) -> None:
        self.settings = settings
        self.clock = clock

    def account(self, records: Mapping[str, WorkerRecord]) -> tuple[dict[str, str], float]:
        """Read what transcripts gained: each running issue now over budget with why, and
        the dollars spent this UTC day."""
        data = load(self.settings)
        costs = self.settings.costs
        today = self.clock().date().isoformat()
        changed = False
        for name, record in records.items():
            if not record.transcript:
                continue
            seen = data["read"].get(name) or {}
            same = seen.get("transcript") == record.transcript  # else a new session's file
            offset = int(seen.get("offset", 0)) if same else 0
            lines, offset = read_lines_from(Path(record.transcript), offset, READ_AT_MOST)
            if not lines:
                continue
            spent, last_id = read_transcript(lines, costs, seen.get("last_id") if same else None)
            data["read"][name] = {"transcript": record.transcript, "offset": offset,
                                  "last_id": last_id}
            changed = True
            if not spent.tokens:
                continue
            roles = data["issues"].setdefault(name, {})
            roles[record.role.value] = (Usage.from_json(roles.get(record.role.value))
                                        + spent).as_json()
            data["days"][today] = round(float(data["days"].get(today, 0.0)) + spent.usd, 6)
        if changed:
            atomic_write_text(ledger_path(self.settings), json.dumps(data, indent=1) + "\n")
        over = {}
        for name, record in records.items():
            why = over_budget(issue_spend(data, name), costs)
            if why is not None and record.running:
                over[name] = why
        return over, float(data["days"].get(today, 0.0))
