"""Reading the local tracker: ``Issue`` objects built from its SQLite file."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from ralph_dev.adapters.tracker.local_db import TrackerDb, parse_time
from ralph_dev.core.errors import UnknownIssue
from ralph_dev.core.model import Comment, Issue, StateType


class LocalReader:
    """Every read of one local tracker, each in a connection of its own."""

    def __init__(self, db: TrackerDb) -> None:
        self.db = db
        self._listed: tuple[tuple[int, int, int], list[Issue]] | None = None
        """The last full listing and the database version it was read at."""

    def load(self, conn: sqlite3.Connection, numbers: Iterable[int] | None) -> list[Issue]:
        """Build Issue objects (all, or just ``numbers``) with a handful of queries."""
        wanted = None if numbers is None else sorted(set(numbers))
        if wanted is not None and not wanted:
            return []
        rows = list(
            conn.execute(
                "SELECT i.*, s.name AS state_name, s.type AS state_type "
                "FROM issues i JOIN states s ON s.position = i.state ORDER BY i.number"
            )
        )
        if wanted is not None:
            keep = set(wanted)
            rows = [r for r in rows if r["number"] in keep]
        labels: dict[int, set[str]] = {}
        for row in conn.execute("SELECT issue, label FROM labels"):
            labels.setdefault(row[0], set()).add(row[1])
        blockers: dict[int, list[int]] = {}
        for row in conn.execute("SELECT blocker, blocked FROM blocks ORDER BY blocker"):
            blockers.setdefault(row[1], []).append(row[0])
        children: dict[int, list[int]] = {}
        for row in conn.execute(
            "SELECT number, parent FROM issues WHERE parent IS NOT NULL ORDER BY number"
        ):
            children.setdefault(row[1], []).append(row[0])
        comments: dict[int, list[Comment]] = {}
        for row in conn.execute(
            "SELECT issue, author, body, by_ralph, created_at FROM comments ORDER BY id"
        ):
            comments.setdefault(row[0], []).append(
                Comment(
                    author=row[1],
                    body=row[2],
                    created_at=parse_time(row[4]),
                    by_ralph=bool(row[3]),
                )
            )
        out = []
        for row in rows:
            number = row["number"]
            ident = self.db.ident(number)
            out.append(
                Issue(
                    identifier=ident,
                    id=ident,
                    title=row["title"],
                    description=row["description"],
                    state_name=row["state_name"],
                    state_type=StateType(row["state_type"]),
                    priority=row["priority"],
                    sort_order=row["sort_order"],
                    labels=frozenset(labels.get(number, ())),
                    parent=self.db.ident(row["parent"]) if row["parent"] is not None else None,
                    children=tuple(self.db.ident(n) for n in children.get(number, ())),
                    blocked_by=tuple(self.db.ident(n) for n in blockers.get(number, ())),
                    comments=tuple(comments.get(number, ())),
                    created_at=parse_time(row["created_at"]),
                    updated_at=parse_time(row["updated_at"]),
                )
            )
        return out

    def one(self, conn: sqlite3.Connection, number: int) -> Issue:
        found = self.load(conn, [number])
        if not found:
            raise UnknownIssue(f"no issue {self.db.ident(number)} in {self.db.db_path}")
        return found[0]

    def list_issues(self) -> list[Issue]:
        """Every issue; read again only when the database changed since the last
        listing (its version is taken before the read, so a commit in between makes the
        next call read again): a controller's tick lists them all, every tick."""
        version = self.db.version()
        if version is not None and self._listed is not None and self._listed[0] == version:
            return list(self._listed[1])
        issues = self.db.call("listing issues", lambda conn: self.load(conn, None))
        if version is not None:
            self._listed = (version, issues)
        return list(issues)

    def get(self, identifier: str) -> Issue:
        number = self.db.number(identifier)
        return self.db.call(f"reading {identifier}", lambda conn: self.one(conn, number))
