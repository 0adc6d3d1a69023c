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
    IDENTIFIER_RE,
    NewIssue,
    check_identifier,
)

log = structlog.get_logger(__name__)


class IssueCreation(TrackerDb):
    """``create_issues_sync`` for :class:`~ralph_dev.adapters.tracker.local.LocalTracker`."""

    def create_issues_sync(self, new: Sequence[NewIssue]) -> list[str]:
        """Create a batch in one transaction: all of it, or (on any problem) none of it."""
        entries = list(new)
        refs = self._check_batch(entries)

        def work(conn: sqlite3.Connection) -> list[str]:
            existing = {self._ident(r[0]) for r in conn.execute("SELECT number FROM issues")}

            def resolve(text: str, what: str, entry: int) -> str:
                if text in refs:
                    return f"ref:{text}"
                self._number(text)  # shape and key
                if text not in existing:
                    raise UnknownIssue(
                        f"{self._entry_name(entries, entry)}: {what} {text} does not exist "
                        f"in {self.db_path}"
                    )
                return text

            default_state = self._resolve_state(conn, DEFAULT_NEW_STATE, None)
            states = []
            for entry in entries:
                if entry.state is not None:
                    states.append(self._resolve_state(conn, entry.state, None))
                elif entry.state_type is not None:
                    states.append(self._resolve_state(conn, None, entry.state_type))
                else:
                    states.append(default_state)
            # Nodes: existing identifiers, "ref:NAME" for batch entries with a ref,
            # "new:I" for the others. Parent and blocker edges both must be acyclic.
            node = [f"ref:{e.ref}" if e.ref else f"new:{i}" for i, e in enumerate(entries)]
            parents: dict[str, str] = {}
            edges = self._edges(conn)
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
            cycle = batch_cycle(entries, self._edges(conn), self._parents(conn))
            if cycle:
                raise TrackerInputError(f"dependency cycle {cycle} ({WAITS_FOR}); "
                                        "nothing was created")

            counter = int(
                conn.execute("SELECT value FROM meta WHERE name = 'next_number'").fetchone()[0]
            )
            top = conn.execute("SELECT COALESCE(MAX(sort_order), 0) FROM issues").fetchone()[0]
            assigned: dict[str, str] = {}
            for i in range(len(entries)):
                assigned[node[i]] = self._ident(counter + i)
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
                        None if parent_ident is None else self._number(parent_ident),
                        now,
                        now,
                    ),
                )
            for i, entry in enumerate(entries):
                number = counter + i
                conn.executemany(
                    "INSERT OR IGNORE INTO labels (issue, label) VALUES (?, ?)",
                    [(number, x) for x in self._check_labels(entry.labels)],
                )
                for blocker in edges.get(node[i], ()):
                    conn.execute(
                        "INSERT OR IGNORE INTO blocks (blocker, blocked) VALUES (?, ?)",
                        (self._number(assigned.get(blocker, blocker)), number),
                    )
            touched = {
                self._number(parents[n]) for n in parents if not parents[n].startswith(("ref:",))
            }
            for number in touched:
                self._touch(conn, number)  # a new child changes its parent
            conn.execute(
                "UPDATE meta SET value = ? WHERE name = 'next_number'",
                (str(counter + len(entries)),),
            )
            created = [assigned[n] for n in node]
            log.info("issues_created", count=len(created), first=created[0] if created else None)
            return created

        if not entries:
            return []
        return self._write_call("creating issues", work)

    @staticmethod
    def _entry_name(entries: Sequence[NewIssue], index: int) -> str:
        entry = entries[index]
        return f"entry {index + 1} ({entry.ref or entry.title!r})"

    def _check_batch(self, entries: Sequence[NewIssue]) -> set[str]:
        """Checks that need no database: titles, priorities, labels, refs."""
        refs: set[str] = set()
        for i, entry in enumerate(entries):
            name = self._entry_name(entries, i)
            if not isinstance(entry.title, str) or not entry.title.strip():
                raise TrackerInputError(f"{name}: the title is empty")
            if "\n" in entry.title.strip():
                raise TrackerInputError(f"{name}: the title must be one line")
            if (
                not isinstance(entry.priority, int)
                or isinstance(entry.priority, bool)
                or not 0 <= entry.priority <= 4
            ):
                raise TrackerInputError(
                    f"{name}: priority {entry.priority!r} is not 0-4 "
                    "(0 none, 1 urgent, 2 high, 3 medium, 4 low)"
                )
            self._check_labels(entry.labels)
            if entry.ref is not None:
                if not entry.ref or entry.ref != entry.ref.strip():
                    raise TrackerInputError(f"{name}: ref {entry.ref!r} is empty or padded")
                if IDENTIFIER_RE.fullmatch(entry.ref):
                    raise TrackerInputError(
                        f"{name}: ref {entry.ref!r} looks like an issue identifier; "
                        "pick a name such as 'schema'"
                    )
                if entry.ref in refs:
                    raise TrackerInputError(f"{name}: ref {entry.ref!r} is used twice")
                refs.add(entry.ref)
        for i, entry in enumerate(entries):
            for text in [*entry.blocked_by, *([entry.parent] if entry.parent else [])]:
                if text in refs:
                    continue
                try:
                    check_identifier(text)
                except ValueError:
                    known = ", ".join(sorted(refs)) or "none"
                    raise TrackerInputError(
                        f"{self._entry_name(entries, i)}: {text!r} is neither an issue "
                        f"identifier nor a ref in this batch (refs: {known})"
                    ) from None
                self._number(text)
        return refs
