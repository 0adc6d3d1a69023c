"""The embedded tracker: one SQLite file per project, holding what Linear holds for us.

Several processes write it at once (the controller, every worker's
``ralph-dev worker …`` call, a person's ``ralph-dev issue …``), so every
write is one ``BEGIN IMMEDIATE`` transaction: the write lock is taken up front,
so two writers queue on the busy timeout instead of failing half-way with
"database is locked" when one upgrades a read lock. WAL lets readers go on
while a writer works. A connection is opened per call: nothing is shared
between threads and a crashed caller leaves no lock behind.

Identifiers are ``KEY-N`` with N from a counter in the ``meta`` table, so a
number is never handed out twice even if issues ever get deleted. Text from
issues is stored and returned as data; only identifiers (checked against
``IDENTIFIER_RE`` and this tracker's key) are used to look things up.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterable, Sequence

import structlog

from ralph_dev.adapters.tracker.local_create import IssueCreation
from ralph_dev.adapters.tracker.local_db import (
    iso,
    parse_time,
    person_name,
    utc_now,
)
from ralph_dev.core.cycles import WAITS_FOR, dependency_cycle, format_cycle
from ralph_dev.core.errors import (
    TrackerInputError,
    UnknownIssue,
)
from ralph_dev.core.model import (
    RALPH_AUTHOR,
    Comment,
    Issue,
    NewIssue,
    StateType,
)

log = structlog.get_logger(__name__)


class LocalTracker(IssueCreation):
    """The SQLite tracker of one project; implements ``core.ports.Tracker``.

    The async methods run their SQLite work in a thread (``asyncio.to_thread``)
    so a writer waiting on another process's lock never blocks the event loop.
    The ``*_sync`` twins are for the CLI and tests.
    """

    def _load(self, conn: sqlite3.Connection, numbers: Iterable[int] | None) -> list[Issue]:
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
            ident = self._ident(number)
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
                    parent=self._ident(row["parent"]) if row["parent"] is not None else None,
                    children=tuple(self._ident(n) for n in children.get(number, ())),
                    blocked_by=tuple(self._ident(n) for n in blockers.get(number, ())),
                    comments=tuple(comments.get(number, ())),
                    created_at=parse_time(row["created_at"]),
                    updated_at=parse_time(row["updated_at"]),
                )
            )
        return out

    def _one(self, conn: sqlite3.Connection, number: int) -> Issue:
        found = self._load(conn, [number])
        if not found:
            raise UnknownIssue(f"no issue {self._ident(number)} in {self.db_path}")
        return found[0]

    def list_issues_sync(self) -> list[Issue]:
        return self._call("listing issues", lambda conn: self._load(conn, None))

    def refresh_sync(self, identifiers: Sequence[str]) -> list[Issue]:
        numbers = [self._number(i) for i in identifiers]
        return self._call("reading issues", lambda conn: self._load(conn, numbers))

    def get_sync(self, identifier: str) -> Issue:
        number = self._number(identifier)
        return self._call(f"reading {identifier}", lambda conn: self._one(conn, number))

    def states_sync(self) -> list[tuple[str, StateType]]:
        """The workflow states in order (name, type)."""
        return self._call(
            "reading states",
            lambda conn: [(r["name"], StateType(r["type"])) for r in self._states(conn)],
        )

    # --- writing -----------------------------------------------------------------

    def set_state_sync(
        self, identifier: str, *, name: str | None = None, type: StateType | None = None
    ) -> Issue:
        number = self._number(identifier)

        def work(conn: sqlite3.Connection) -> Issue:
            self._existing(conn, identifier)
            position = self._resolve_state(conn, name, type)
            current = conn.execute(
                "SELECT state FROM issues WHERE number = ?", (number,)
            ).fetchone()[0]
            if current != position:
                conn.execute(
                    "UPDATE issues SET state = ?, updated_at = ? WHERE number = ?",
                    (position, iso(utc_now()), number),
                )
                log.info("issue_state", issue=identifier, state=position)
            return self._one(conn, number)

        return self._write_call(f"setting the state of {identifier}", work)

    def change_labels_sync(
        self, identifier: str, *, add: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> Issue:
        """Add and remove labels in one transaction; unchanged → nothing written."""
        number = self._number(identifier)
        adding = self._check_labels(add)
        removing = self._check_labels(remove)
        both = set(adding) & set(removing)
        if both:
            raise TrackerInputError(
                f"label {sorted(both)[0]!r} is both added and removed; give it once"
            )

        def work(conn: sqlite3.Connection) -> Issue:
            self._existing(conn, identifier)
            have = {r[0] for r in conn.execute("SELECT label FROM labels WHERE issue = ?",
                                                (number,))}
            new = [label for label in dict.fromkeys(adding) if label not in have]
            gone = [label for label in dict.fromkeys(removing) if label in have]
            conn.executemany(
                "INSERT INTO labels (issue, label) VALUES (?, ?)", [(number, x) for x in new]
            )
            conn.executemany(
                "DELETE FROM labels WHERE issue = ? AND label = ?", [(number, x) for x in gone]
            )
            if new or gone:
                self._touch(conn, number)
                log.info("issue_labels", issue=identifier, added=new, removed=gone)
            return self._one(conn, number)

        return self._write_call(f"changing labels of {identifier}", work)

    def set_priority_sync(self, identifier: str, priority: int) -> Issue:
        number = self._number(identifier)
        if not isinstance(priority, int) or isinstance(priority, bool) or priority not in range(5):
            raise TrackerInputError(f"priority {priority!r} is not 0-4 (0 = none, 1 = urgent, "
                                    "4 = low)")

        def work(conn: sqlite3.Connection) -> Issue:
            self._existing(conn, identifier)
            if conn.execute("UPDATE issues SET priority = ? WHERE number = ? AND priority != ?",
                            (priority, number, priority)).rowcount:
                self._touch(conn, number)
                log.info("issue_priority", issue=identifier, priority=priority)
            return self._one(conn, number)

        return self._write_call(f"setting the priority of {identifier}", work)

    def comment_sync(
        self, identifier: str, body: str, *, by_ralph: bool = True, author: str | None = None
    ) -> None:
        number = self._number(identifier)
        if not isinstance(body, str) or not body.strip():
            raise TrackerInputError("a comment needs some text")
        who = author or (RALPH_AUTHOR if by_ralph else person_name())

        def work(conn: sqlite3.Connection) -> None:
            self._existing(conn, identifier)
            now = iso(utc_now())
            conn.execute(
                "INSERT INTO comments (issue, author, body, by_ralph, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (number, who, body, int(by_ralph), now),
            )
            conn.execute("UPDATE issues SET updated_at = ? WHERE number = ?", (now, number))
            log.info("issue_comment", issue=identifier, by_ralph=by_ralph)

        self._write_call(f"commenting on {identifier}", work)

    def add_blocker_sync(self, identifier: str, blocker: str) -> Issue:
        """Record that ``blocker`` blocks ``identifier``; refuses a cycle, naming it."""
        number = self._number(identifier)
        blocker_number = self._number(blocker)

        def work(conn: sqlite3.Connection) -> Issue:
            self._existing(conn, identifier)
            self._existing(conn, blocker)
            edges = self._edges(conn)
            if blocker in edges.get(identifier, set()):
                return self._one(conn, number)
            edges.setdefault(identifier, set()).add(blocker)
            cycle = dependency_cycle(edges, self._parents(conn))
            if cycle:
                raise TrackerInputError(
                    f"{identifier} cannot be blocked by {blocker}: that makes a dependency "
                    f"cycle {format_cycle(cycle)} ({WAITS_FOR})"
                )
            conn.execute(
                "INSERT INTO blocks (blocker, blocked) VALUES (?, ?)", (blocker_number, number)
            )
            self._touch(conn, number)
            log.info("issue_blocker", issue=identifier, blocker=blocker)
            return self._one(conn, number)

        return self._write_call(f"adding a blocker to {identifier}", work)

    def remove_blocker_sync(self, identifier: str, blocker: str) -> Issue:
        number = self._number(identifier)
        blocker_number = self._number(blocker)

        def work(conn: sqlite3.Connection) -> Issue:
            self._existing(conn, identifier)
            gone = conn.execute(
                "DELETE FROM blocks WHERE blocker = ? AND blocked = ?", (blocker_number, number)
            ).rowcount
            if gone:
                self._touch(conn, number)
            return self._one(conn, number)

        return self._write_call(f"removing a blocker of {identifier}", work)

    # --- the async Protocol --------------------------------------------------------

    async def list_issues(self) -> list[Issue]:
        return await asyncio.to_thread(self.list_issues_sync)

    async def refresh(self, identifiers: Sequence[str]) -> list[Issue]:
        return await asyncio.to_thread(self.refresh_sync, list(identifiers))

    async def get(self, identifier: str) -> Issue:
        return await asyncio.to_thread(self.get_sync, identifier)

    async def set_state(
        self, identifier: str, *, name: str | None = None, type: StateType | None = None
    ) -> Issue:
        return await asyncio.to_thread(self.set_state_sync, identifier, name=name, type=type)

    async def set_priority(self, identifier: str, priority: int) -> Issue:
        return await asyncio.to_thread(self.set_priority_sync, identifier, priority)

    async def add_labels(self, identifier: str, labels: Sequence[str]) -> Issue:
        return await asyncio.to_thread(self.change_labels_sync, identifier, add=list(labels))

    async def remove_labels(self, identifier: str, labels: Sequence[str]) -> Issue:
        return await asyncio.to_thread(self.change_labels_sync, identifier, remove=list(labels))

    async def change_labels(
        self, identifier: str, *, add: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> Issue:
        return await asyncio.to_thread(
            self.change_labels_sync, identifier, add=list(add), remove=list(remove)
        )

    async def comment(
        self, identifier: str, body: str, *, by_ralph: bool = True, author: str | None = None
    ) -> None:
        await asyncio.to_thread(
            self.comment_sync, identifier, body, by_ralph=by_ralph, author=author
        )

    async def create_issues(self, new: Sequence[NewIssue]) -> list[str]:
        return await asyncio.to_thread(self.create_issues_sync, list(new))

    async def add_blocker(self, identifier: str, blocker: str) -> Issue:
        return await asyncio.to_thread(self.add_blocker_sync, identifier, blocker)

    async def remove_blocker(self, identifier: str, blocker: str) -> Issue:
        return await asyncio.to_thread(self.remove_blocker_sync, identifier, blocker)

    async def states(self) -> list[tuple[str, StateType]]:
        return await asyncio.to_thread(self.states_sync)

    async def close(self) -> None:
        """Nothing to release: every call opens and closes its own connection."""

    def renamed(self) -> dict[str, str]:
        """Local issues are never renumbered."""
        return {}

    def usage(self) -> None:
        """A local file has no request budget."""

    def expect_changes(self) -> None:
        """Every read is fresh already: nothing to do."""
