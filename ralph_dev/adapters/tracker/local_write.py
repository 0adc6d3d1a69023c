"""Writing the local tracker: states, labels, priorities, comments and blockers.

Each write is one ``BEGIN IMMEDIATE`` transaction (``TrackerDb.write_call``)
that also reads the issue back as it now is, so a caller never sees a state
between two writers. Nothing is written when nothing would change.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import structlog

from ralph_dev.adapters.tracker.batch import checked_labels
from ralph_dev.adapters.tracker.local_db import TrackerDb, iso, person_name, utc_now
from ralph_dev.adapters.tracker.local_read import LocalReader
from ralph_dev.core.cycles import WAITS_FOR, dependency_cycle, format_cycle
from ralph_dev.core.errors import TrackerInputError
from ralph_dev.core.model import RALPH_AUTHOR, Issue, StateType

log = structlog.get_logger(__name__)


class LocalWriter:
    """The writes to one local tracker's existing issues."""

    def __init__(self, db: TrackerDb, reader: LocalReader) -> None:
        self.db = db
        self.reader = reader

    def set_state(
        self, identifier: str, *, name: str | None = None, type: StateType | None = None
    ) -> Issue:
        number = self.db.number(identifier)

        def work(conn: sqlite3.Connection) -> Issue:
            self.db.existing(conn, identifier)
            position = self.db.resolve_state(conn, name, type)
            current = conn.execute(
                "SELECT state FROM issues WHERE number = ?", (number,)
            ).fetchone()[0]
            if current != position:
                conn.execute(
                    "UPDATE issues SET state = ?, updated_at = ? WHERE number = ?",
                    (position, iso(utc_now()), number),
                )
                log.info("issue_state", issue=identifier, state=position)
            return self.reader.one(conn, number)

        return self.db.write_call(f"setting the state of {identifier}", work)

    def change_labels(
        self, identifier: str, *, add: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> Issue:
        """Add and remove labels in one transaction; unchanged → nothing written."""
        number = self.db.number(identifier)
        adding = checked_labels(add)
        removing = checked_labels(remove)
        both = set(adding) & set(removing)
        if both:
            raise TrackerInputError(
                f"label {sorted(both)[0]!r} is both added and removed; give it once"
            )

        def work(conn: sqlite3.Connection) -> Issue:
            self.db.existing(conn, identifier)
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
                self.db.touch(conn, number)
                log.info("issue_labels", issue=identifier, added=new, removed=gone)
            return self.reader.one(conn, number)

        return self.db.write_call(f"changing labels of {identifier}", work)

    def set_priority(self, identifier: str, priority: int) -> Issue:
        number = self.db.number(identifier)
        if not isinstance(priority, int) or isinstance(priority, bool) or priority not in range(5):
            raise TrackerInputError(f"priority {priority!r} is not 0-4 (0 = none, 1 = urgent, "
                                    "4 = low)")

        def work(conn: sqlite3.Connection) -> Issue:
            self.db.existing(conn, identifier)
            if conn.execute("UPDATE issues SET priority = ? WHERE number = ? AND priority != ?",
                            (priority, number, priority)).rowcount:
                self.db.touch(conn, number)
                log.info("issue_priority", issue=identifier, priority=priority)
            return self.reader.one(conn, number)

        return self.db.write_call(f"setting the priority of {identifier}", work)

    def comment(
        self, identifier: str, body: str, *, by_ralph: bool = True, author: str | None = None
    ) -> None:
        number = self.db.number(identifier)
        if not isinstance(body, str) or not body.strip():
            raise TrackerInputError("a comment needs some text")
        who = author or (RALPH_AUTHOR if by_ralph else person_name())

        def work(conn: sqlite3.Connection) -> None:
            self.db.existing(conn, identifier)
            now = iso(utc_now())
            conn.execute(
                "INSERT INTO comments (issue, author, body, by_ralph, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (number, who, body, int(by_ralph), now),
            )
            conn.execute("UPDATE issues SET updated_at = ? WHERE number = ?", (now, number))
            log.info("issue_comment", issue=identifier, by_ralph=by_ralph)

        self.db.write_call(f"commenting on {identifier}", work)

    def add_blocker(self, identifier: str, blocker: str) -> Issue:
        """Record that ``blocker`` blocks ``identifier``; refuses a cycle, naming it."""
        number = self.db.number(identifier)
        blocker_number = self.db.number(blocker)

        def work(conn: sqlite3.Connection) -> Issue:
            self.db.existing(conn, identifier)
            self.db.existing(conn, blocker)
            edges = self.db.edges(conn)
            if blocker in edges.get(identifier, set()):
                return self.reader.one(conn, number)
            edges.setdefault(identifier, set()).add(blocker)
            cycle = dependency_cycle(edges, self.db.parents(conn))
            if cycle:
                raise TrackerInputError(
                    f"{identifier} cannot be blocked by {blocker}: that makes a dependency "
                    f"cycle {format_cycle(cycle)} ({WAITS_FOR})"
                )
            conn.execute(
                "INSERT INTO blocks (blocker, blocked) VALUES (?, ?)", (blocker_number, number)
            )
            self.db.touch(conn, number)
            log.info("issue_blocker", issue=identifier, blocker=blocker)
            return self.reader.one(conn, number)

        return self.db.write_call(f"adding a blocker to {identifier}", work)

    def remove_blocker(self, identifier: str, blocker: str) -> Issue:
        number = self.db.number(identifier)
        blocker_number = self.db.number(blocker)

        def work(conn: sqlite3.Connection) -> Issue:
            self.db.existing(conn, identifier)
            gone = conn.execute(
                "DELETE FROM blocks WHERE blocker = ? AND blocked = ?", (blocker_number, number)
            ).rowcount
            if gone:
                self.db.touch(conn, number)
            return self.reader.one(conn, number)

        return self.db.write_call(f"removing a blocker of {identifier}", work)
