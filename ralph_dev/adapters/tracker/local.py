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
import contextlib
import getpass
import os
import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import structlog

from ralph_dev.adapters.tracker.base import (
    TrackerError,
    TrackerInputError,
    TrackerUnavailable,
    UnknownIssue,
)
from ralph_dev.core.model import (
    IDENTIFIER_RE,
    RALPH_AUTHOR,
    Comment,
    InvalidIdentifier,
    Issue,
    NewIssue,
    StateType,
    check_identifier,
)

log = structlog.get_logger(__name__)

T = TypeVar("T")

SCHEMA_VERSION = 1
BUSY_TIMEOUT_MS = 10_000

DEFAULT_STATES: tuple[tuple[str, StateType], ...] = (
    ("Backlog", StateType.BACKLOG),
    ("Todo", StateType.UNSTARTED),
    ("In Progress", StateType.STARTED),
    ("In Review", StateType.STARTED),
    ("Done", StateType.COMPLETED),
    ("Canceled", StateType.CANCELED),
)
DEFAULT_NEW_STATE = "Todo"
MAX_LABEL_LENGTH = 80

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS states (
    position INTEGER PRIMARY KEY,
    name     TEXT NOT NULL UNIQUE COLLATE NOCASE,
    type     TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS issues (
    number      INTEGER PRIMARY KEY,
    title       TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    priority    INTEGER NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 4),
    sort_order  REAL NOT NULL DEFAULT 0,
    state       INTEGER NOT NULL REFERENCES states(position),
    parent      INTEGER REFERENCES issues(number),
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS labels (
    issue INTEGER NOT NULL REFERENCES issues(number),
    label TEXT NOT NULL,
    PRIMARY KEY (issue, label)
);
CREATE TABLE IF NOT EXISTS blocks (
    blocker INTEGER NOT NULL REFERENCES issues(number),
    blocked INTEGER NOT NULL REFERENCES issues(number),
    PRIMARY KEY (blocker, blocked)
);
CREATE TABLE IF NOT EXISTS comments (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    issue      INTEGER NOT NULL REFERENCES issues(number),
    author     TEXT NOT NULL,
    body       TEXT NOT NULL,
    by_ralph   INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS issues_parent ON issues(parent);
CREATE INDEX IF NOT EXISTS blocks_blocked ON blocks(blocked);
CREATE INDEX IF NOT EXISTS comments_issue ON comments(issue);
"""


class TrackerDatabaseError(TrackerError):
    """The database file itself is unusable (not SQLite, read-only, another project's)."""

    retryable = False


def _now() -> datetime:
    return datetime.now(UTC)


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def _parse_time(text: str) -> datetime:
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def person_name() -> str:
    """Who a person's comment is from: ``$USER``, else the login name, else "person"."""
    name = os.environ.get("USER") or ""
    if not name:
        with contextlib.suppress(Exception):
            name = getpass.getuser()
    return name.strip() or "person"


def format_cycle(path: Sequence[str]) -> str:
    """``["A", "B", "A"]`` → ``"A → B → A"`` (each is blocked by the next)."""
    return " → ".join(path)


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle in ``edges`` (node → nodes it is blocked by) as a closed path, or None.

    Iterative DFS so a long chain of blockers cannot hit the recursion limit;
    nodes are visited in sorted order so the reported cycle is deterministic.
    """
    white, grey, black = 0, 1, 2
    colour: dict[str, int] = {}
    for start in sorted(edges):
        if colour.get(start, white) != white:
            continue
        stack: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges.get(start, ()))))]
        path = [start]
        colour[start] = grey
        while stack:
            node, children = stack[-1]
            advanced = False
            for child in children:
                state = colour.get(child, white)
                if state == grey:
                    return [*path[path.index(child):], child]
                if state == white:
                    colour[child] = grey
                    path.append(child)
                    stack.append((child, iter(sorted(edges.get(child, ())))))
                    advanced = True
                    break
            if not advanced:
                colour[node] = black
                path.pop()
                stack.pop()
    return None


class LocalTracker:
    """The SQLite tracker of one project; implements ``tracker.base.Tracker``.

    The async methods run their SQLite work in a thread (``asyncio.to_thread``)
    so a writer waiting on another process's lock never blocks the event loop.
    The ``*_sync`` twins are for the CLI and tests.
    """

    def __init__(self, db_path: Path, key: str) -> None:
        if not isinstance(key, str) or not re.fullmatch(r"[A-Z][A-Z0-9]{0,9}", key):
            raise TrackerInputError(
                f"tracker key {key!r} is not usable: 1-10 capital letters/digits, "
                "starting with a letter (set tracker.key in the project's config)"
            )
        self.db_path = Path(db_path)
        self.key = key
        self._ready = False

    def __repr__(self) -> str:
        return f"LocalTracker({str(self.db_path)!r}, key={self.key!r})"

    # --- connections -----------------------------------------------------------

    def _fail(self, exc: sqlite3.Error, doing: str) -> TrackerError:
        """Turn a sqlite3 error into one a person can act on."""
        text = str(exc)
        lowered = text.lower()
        path = self.db_path
        if "not a database" in lowered:
            return TrackerDatabaseError(
                f"{path} is not a SQLite database ({text}); move it aside "
                "(ralph-dev then starts a fresh tracker there) or restore it from a backup"
            )
        if "malformed" in lowered or "corrupt" in lowered:
            return TrackerDatabaseError(
                f"{path} is a damaged SQLite database ({text}); restore it from a backup, "
                f"or try: sqlite3 {path} .recover | sqlite3 recovered.db"
            )
        if "readonly" in lowered or "read-only" in lowered:
            return TrackerDatabaseError(
                f"{path} is read-only ({text}) while {doing}; make the file and its "
                f"directory {path.parent} writable (chmod u+w, chattr -i) and try again"
            )
        if "locked" in lowered or "busy" in lowered:
            return TrackerUnavailable(
                f"{path} is locked by another writer (waited up to "
                f"{BUSY_TIMEOUT_MS // 1000} s) while {doing}; try again"
            )
        if "unable to open" in lowered or "disk i/o" in lowered or "cannot" in lowered:
            return TrackerDatabaseError(
                f"cannot use the tracker database {path} ({text}) while {doing}; check that "
                "the file and its directory exist and are readable and writable"
            )
        return TrackerError(f"tracker database {path}: {text} (while {doing})")

    def _connect(self) -> sqlite3.Connection:
        if self.db_path.exists() and not self.db_path.is_file():
            raise TrackerDatabaseError(
                f"{self.db_path} is not a file; remove it or point the project elsewhere"
            )
        try:
            self.db_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrackerDatabaseError(
                f"cannot create the tracker directory {self.db_path.parent}: {exc.strerror}"
            ) from exc
        try:
            conn = sqlite3.connect(
                str(self.db_path),
                timeout=BUSY_TIMEOUT_MS / 1000,
                isolation_level=None,  # we issue BEGIN IMMEDIATE ourselves
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise self._fail(exc, "opening it") from exc
        conn.row_factory = sqlite3.Row
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA foreign_keys = ON")
            if not self._ready:
                self._prepare(conn)
                self._ready = True
        except sqlite3.Error as exc:
            conn.close()
            raise self._fail(exc, "opening it") from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _prepare(self, conn: sqlite3.Connection) -> None:
        """Create or check the schema, once per tracker object.

        Level-triggered: a fresh file gets the schema and default states; a
        file of ours is only checked (version, key); anything else is refused
        rather than written into.
        """
        tables = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if "meta" in tables:
            self._check_meta(conn)
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                conn.execute("PRAGMA journal_mode = WAL")
            return
        if tables - {"sqlite_sequence"}:
            raise TrackerDatabaseError(
                f"{self.db_path} is a SQLite database but not a ralph-dev tracker "
                f"(it has tables {', '.join(sorted(tables))}); move it aside or choose "
                "another project name"
            )
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            log.warning("tracker_not_wal", path=str(self.db_path), mode=mode)
        with self._write(conn):
            if conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
            ).fetchone():
                pass  # another process created it between our look and our lock
            else:
                # Not executescript: it would COMMIT our BEGIN IMMEDIATE first.
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.executemany(
                    "INSERT INTO meta (name, value) VALUES (?, ?)",
                    [
                        ("schema_version", str(SCHEMA_VERSION)),
                        ("key", self.key),
                        ("next_number", "1"),
                        ("created_at", _iso(_now())),
                    ],
                )
                conn.executemany(
                    "INSERT INTO states (position, name, type) VALUES (?, ?, ?)",
                    [(i, name, t.value) for i, (name, t) in enumerate(DEFAULT_STATES, 1)],
                )
                log.info("tracker_created", path=str(self.db_path), key=self.key)
        self._check_meta(conn)

    def _check_meta(self, conn: sqlite3.Connection) -> None:
        meta = {row[0]: row[1] for row in conn.execute("SELECT name, value FROM meta")}
        version = meta.get("schema_version")
        if version != str(SCHEMA_VERSION):
            raise TrackerDatabaseError(
                f"{self.db_path} has tracker schema version {version!r}, this ralph-dev "
                f"understands {SCHEMA_VERSION}; use the ralph-dev version that wrote it"
            )
        if meta.get("key") != self.key:
            raise TrackerDatabaseError(
                f"{self.db_path} holds issues with key {meta.get('key')!r}, but the project "
                f"is configured with key {self.key!r}; set tracker.key = "
                f"{meta.get('key')!r} in the project's config"
            )

    @contextlib.contextmanager
    def _write(self, conn: sqlite3.Connection) -> Iterator[None]:
        """One write transaction: the lock is taken first, everything or nothing lands."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            conn.rollback()
            raise
        else:
            conn.commit()

    def _call(self, doing: str, func: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._connect()
        try:
            return func(conn)
        except sqlite3.Error as exc:
            raise self._fail(exc, doing) from exc
        finally:
            conn.close()

    def _write_call(self, doing: str, func: Callable[[sqlite3.Connection], T]) -> T:
        def inside(conn: sqlite3.Connection) -> T:
            with self._write(conn):
                return func(conn)

        return self._call(doing, inside)

    # --- identifiers -------------------------------------------------------------

    def _number(self, identifier: str) -> int:
        """The issue number of ``identifier``, after checking its shape and key."""
        check_identifier(identifier)
        if not IDENTIFIER_RE.fullmatch(identifier):  # "$" alone lets "DEMO-1\n" through
            raise InvalidIdentifier(
                f"{identifier!r} is not an issue identifier: expected KEY-N such as ENG-12 "
                "with nothing before or after it"
            )
        key, number = identifier.rsplit("-", 1)
        if key != self.key:
            raise TrackerInputError(
                f"{identifier} belongs to another project (this tracker's key is {self.key}); "
                "issues of different projects cannot refer to each other"
            )
        return int(number)

    def _ident(self, number: int) -> str:
        return f"{self.key}-{number}"

    def _existing(self, conn: sqlite3.Connection, identifier: str) -> int:
        number = self._number(identifier)
        if not conn.execute("SELECT 1 FROM issues WHERE number = ?", (number,)).fetchone():
            raise UnknownIssue(f"no issue {identifier} in {self.db_path}")
        return number

    # --- reading -----------------------------------------------------------------

    def _states(self, conn: sqlite3.Connection) -> list[sqlite3.Row]:
        return list(conn.execute("SELECT position, name, type FROM states ORDER BY position"))

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
                    created_at=_parse_time(row[4]),
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
                    created_at=_parse_time(row["created_at"]),
                    updated_at=_parse_time(row["updated_at"]),
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

    def _touch(self, conn: sqlite3.Connection, number: int) -> None:
        conn.execute(
            "UPDATE issues SET updated_at = ? WHERE number = ?", (_iso(_now()), number)
        )

    def _resolve_state(
        self, conn: sqlite3.Connection, name: str | None, type: StateType | str | None
    ) -> int:
        """The position of the state called ``name`` (any case) or the first of ``type``."""
        states = self._states(conn)
        valid = ", ".join(f"{r['name']} ({r['type']})" for r in states)
        if (name is None) == (type is None):
            raise TrackerInputError("give exactly one of a state name or a state type")
        if name is not None:
            for row in states:
                if row["name"].casefold() == name.strip().casefold():
                    return int(row["position"])
            raise TrackerInputError(f"unknown state {name!r}; valid states: {valid}")
        try:
            wanted = StateType(type)
        except ValueError:
            raise TrackerInputError(
                f"unknown state type {type!r}; valid types: {', '.join(StateType)}"
            ) from None
        for row in states:
            if row["type"] == wanted.value:
                return int(row["position"])
        raise TrackerInputError(f"no state of type {wanted.value!r}; valid states: {valid}")

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
                    (position, _iso(_now()), number),
                )
                log.info("issue_state", issue=identifier, state=position)
            return self._one(conn, number)

        return self._write_call(f"setting the state of {identifier}", work)

    @staticmethod
    def _check_labels(labels: Iterable[str]) -> list[str]:
        out = []
        for label in labels:
            if not isinstance(label, str) or not label.strip():
                raise TrackerInputError(f"label {label!r} is empty; give a name such as 'backend'")
            label = label.strip()
            if len(label) > MAX_LABEL_LENGTH or any(ch in label for ch in "\n\r\t\0"):
                shown = label if len(label) <= 40 else label[:37] + "..."
                raise TrackerInputError(
                    f"label {shown!r} is not usable: at most {MAX_LABEL_LENGTH} characters "
                    "on one line"
                )
            out.append(label)
        return out

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

    def add_labels_sync(self, identifier: str, labels: Sequence[str]) -> Issue:
        return self.change_labels_sync(identifier, add=labels)

    def remove_labels_sync(self, identifier: str, labels: Sequence[str]) -> Issue:
        return self.change_labels_sync(identifier, remove=labels)

    def comment_sync(
        self, identifier: str, body: str, *, by_ralph: bool = True, author: str | None = None
    ) -> None:
        number = self._number(identifier)
        if not isinstance(body, str) or not body.strip():
            raise TrackerInputError("a comment needs some text")
        who = author or (RALPH_AUTHOR if by_ralph else person_name())

        def work(conn: sqlite3.Connection) -> None:
            self._existing(conn, identifier)
            now = _iso(_now())
            conn.execute(
                "INSERT INTO comments (issue, author, body, by_ralph, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (number, who, body, int(by_ralph), now),
            )
            conn.execute("UPDATE issues SET updated_at = ? WHERE number = ?", (now, number))
            log.info("issue_comment", issue=identifier, by_ralph=by_ralph)

        self._write_call(f"commenting on {identifier}", work)

    def _edges(self, conn: sqlite3.Connection) -> dict[str, set[str]]:
        """Existing relations as identifier → identifiers it is blocked by."""
        edges: dict[str, set[str]] = {}
        for row in conn.execute("SELECT blocker, blocked FROM blocks"):
            edges.setdefault(self._ident(row[1]), set()).add(self._ident(row[0]))
        return edges

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
            cycle = find_cycle(edges)
            if cycle:
                raise TrackerInputError(
                    f"{identifier} cannot be blocked by {blocker}: that makes a blocker cycle "
                    f"{format_cycle(cycle)} (each is blocked by the next)"
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
                states.append(
                    default_state
                    if entry.state is None
                    else self._resolve_state(conn, entry.state, None)
                )
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
            cycle = find_cycle(edges)
            if cycle:
                raise TrackerInputError(
                    f"blocker cycle {show(cycle)} (each is blocked by the next); "
                    "nothing was created"
                )

            counter = int(
                conn.execute("SELECT value FROM meta WHERE name = 'next_number'").fetchone()[0]
            )
            top = conn.execute("SELECT COALESCE(MAX(sort_order), 0) FROM issues").fetchone()[0]
            assigned: dict[str, str] = {}
            for i in range(len(entries)):
                assigned[node[i]] = self._ident(counter + i)
            now = _iso(_now())
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


def issue_to_json(issue: Issue) -> dict[str, Any]:
    """Plain JSON-able data for ``issue list/show --json``."""
    return {
        "identifier": issue.identifier,
        "title": issue.title,
        "state": issue.state_name,
        "state_type": issue.state_type.value,
        "priority": issue.priority,
        "sort_order": issue.sort_order,
        "labels": sorted(issue.labels),
        "parent": issue.parent,
        "children": list(issue.children),
        "blocked_by": list(issue.blocked_by),
        "description": issue.description,
        "comments": [
            {
                "author": c.author,
                "body": c.body,
                "created_at": c.created_at.isoformat(),
                "by_ralph": c.by_ralph,
            }
            for c in issue.comments
        ],
        "created_at": issue.created_at.isoformat() if issue.created_at else None,
        "updated_at": issue.updated_at.isoformat() if issue.updated_at else None,
    }
