"""Creating a batch of issues in the local tracker: all of it in one transaction, or none.

A batch (``issue import``, a plan worker's ``worker plan``) may point into
itself: parents and blockers by ``ref``. Everything is checked first — titles,
refs, identifiers, states, labels, and that the new blocker edges make no
cycle with the existing ones — so a refused batch writes nothing at all.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import structlog

from ralph_dev.adapters.tracker.batch import check_batch, checked_labels, entry_name
from ralph_dev.adapters.tracker.local_db import (
    DEFAULT_NEW_STATE,
    TrackerDb,
    iso,
    utc_now,
)
from ralph_dev.core.cycles import WAITS_FOR, batch_cycle, format_cycle
from ralph_dev.core.errors import (
    TrackerInputError,
    UnknownIssue,
)
from ralph_dev.core.model import (
    NewIssue,
)

log = structlog.get_logger(__name__)


class LocalIssueCreator:
    """``create_issues`` of one local tracker."""

    def __init__(self, db: TrackerDb) -> None:
        self.db = db

    def create_issues(self, new: Sequence[NewIssue]) -> list[str]:
        """Create a batch in one transaction: all of it, or (on any problem) none of it."""
        entries = list(new)
        refs = check_batch(entries, self.db.number)

        def work(conn: sqlite3.Connection) -> list[str]:
            existing = {self.db.ident(r[0]) for r in conn.execute("SELECT number FROM issues")}

            def resolve(text: str, what: str, entry: int) -> str:
                if text in refs:
                    return f"ref:{text}"
                self.db.number(text)  # shape and key
                if text not in existing:
                    raise UnknownIssue(
                        f"{entry_name(entries, entry)}: {what} {text} does not exist "
                        f"in {self.db.db_path}"
                    )
                return text

            default_state = self.db.resolve_state(conn, DEFAULT_NEW_STATE, None)
            states = []
            for entry in entries:
                if entry.state is not None:
                    states.append(self.db.resolve_state(conn, entry.state, None))
                elif entry.state_type is not None:
                    states.append(self.db.resolve_state(conn, None, entry.state_type))
                else:
                    states.append(default_state)
            # Nodes: existing identifiers, "ref:NAME" for batch entries with a ref,
            # "new:I" for the others. Parent and blocker edges both must be acyclic.
            node = [f"ref:{e.ref}" if e.ref else f"new:{i}" for i, e in enumerate(entries)]
            parents: dict[str, str] = {}
            edges = self.db.edges(conn)
            for i, entry in enumerate(entries):
                if entry.parent is not None:
                    parents[node[i]] = resolve(entry.parent, "parent", i)
                for blocker in entry.blocked_by:
                    edges.setdefault(node[i], set()).add(resolve(blocker, "blocker", i))
            names = {n: (n[4:] if n.startswith("ref:") else n) for n in node}
            for i, n in enumerate(node):
                if n.startswith("new:"):
                    names[n] = repr(entries[i].title)

            def show(path: list[str]) -> str:
                return format_cycle([names.get(p, p) for p in path])

            for start in parents:
                seen = [start]
                here = start
                while here in parents:
                    here = parents[here]
                    if here in seen:
                        loop = [*seen[seen.index(here):], here]
                        raise TrackerInputError(
                            f"parent cycle {show(loop)} (each is the parent of the previous); "
                            "nothing was created"
                        )
                    seen.append(here)
            cycle = batch_cycle(entries, self.db.edges(conn), self.db.parents(conn))
            if cycle:
                raise TrackerInputError(f"dependency cycle {cycle} ({WAITS_FOR}); "
                                        "nothing was created")

            counter = int(
                conn.execute("SELECT value FROM meta WHERE name = 'next_number'").fetchone()[0]
            )
            top = conn.execute("SELECT COALESCE(MAX(sort_order), 0) FROM issues").fetchone()[0]
            assigned: dict[str, str] = {}
            for i in range(len(entries)):
                assigned[node[i]] = self.db.ident(counter + i)
            now = iso(utc_now())
            for i, entry in enumerate(entries):
                number = counter + i
                parent = parents.get(node[i])
                parent_ident = assigned.get(parent, parent) if parent else None
                conn.execute(
                    "INSERT INTO issues (number, title, description, priority, sort_order, "
                    "state, parent, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        number,
                        entry.title.strip(),
                        entry.description,
                        entry.priority,
                        top + i + 1,
                        states[i],
                        None if parent_ident is None else self.db.number(parent_ident),
                        now,
                        now,
                    ),
                )
            for i, entry in enumerate(entries):
                number = counter + i
                conn.executemany(
                    "INSERT OR IGNORE INTO labels (issue, label) VALUES (?, ?)",
                    [(number, x) for x in checked_labels(entry.labels)],
                )
                for blocker in edges.get(node[i], ()):
                    conn.execute(
                        "INSERT OR IGNORE INTO blocks (blocker, blocked) VALUES (?, ?)",
                        (self.db.number(assigned.get(blocker, blocker)), number),
                    )
            touched = {
                self.db.number(parents[n]) for n in parents if not parents[n].startswith(("ref:",))
            }
            for number in touched:
                self.db.touch(conn, number)  # a new child changes its parent
            conn.execute(
                "UPDATE meta SET value = ? WHERE name = 'next_number'",
                (str(counter + len(entries)),),
            )
            created = [assigned[n] for n in node]
            log.info("issues_created", count=len(created), first=created[0] if created else None)
            return created

        if not entries:
            return []
        return self.db.write_call("creating issues", work)
