"""The local tracker's SQLite file: schema, connections, transactions.

Several processes write it at once (the controller, every worker's
``ralph-dev worker …`` call, a person's ``ralph-dev issue …``), so every
write is one ``BEGIN IMMEDIATE`` transaction: the write lock is taken up front,
so two writers queue on the busy timeout instead of failing half-way with
"database is locked" when one upgrades a read lock. WAL lets readers go on
while a writer works. A connection is opened per call: nothing is shared
between threads and a crashed caller leaves no lock behind.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import structlog

from ralph_dev.core.errors import (
    TrackerError,
    TrackerInputError,
    TrackerUnavailable,
    UnknownIssue,
)
from ralph_dev.core.model import (
    IDENTIFIER_RE,
    InvalidIdentifier,
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


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def parse_time(text: str) -> datetime:
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def person_name() -> str:
    """Who a person's comment is from: ``$USER``, else the login name, else "person"."""
    name = os.environ.get("USER") or ""
    if not name:
        with contextlib.suppress(Exception):
            name = getpass.getuser()
    return name.strip() or "person"



class TrackerDb:
    """One project's tracker database file, opened per call: what the local tracker's
    reader, writer and issue creator share (connections, transactions, identifiers,
    states and the blocker graph)."""

    def __init__(self, db_path: Path, key: str) -> None:
        if not isinstance(key, str) or not re.fullmatch(r"[A-Z][A-Z0-9]{0,9}", key):
            raise TrackerInputError(
                f"tracker key {key!r} is not usable: 1-10 capital letters/digits, "
                "starting with a letter (set tracker.key in the project's config)"
            )
        self.db_path = Path(db_path)
        self.key = key
        self._ready = False
        self._probe: tuple[tuple[int, int], sqlite3.Connection] | None = None
        self._probe_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TrackerDb({str(self.db_path)!r}, key={self.key!r})"

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
            self.db_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise TrackerDatabaseError(
                f"cannot create the tracker directory {self.db_path.parent}: {exc.strerror}"
            ) from exc
        if not self.db_path.exists():
            self._create_fresh()
        conn = self._open(self.db_path)
        try:
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

    def _open(self, path: Path) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                str(path),
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
        except sqlite3.Error as exc:
            conn.close()
            raise self._fail(exc, "opening it") from exc
        return conn

    def _create_fresh(self) -> None:
        """Build a new tracker whole in a private file, then link it into place.

        Processes that find no database at once each build their own and the first
        link wins; the others drop theirs. Nobody ever sees a half-made file, and the
        switch to WAL (which needs the file to itself) never races a reader.
        """
        draft = self.db_path.with_name(f".{self.db_path.name}.{os.getpid()}.new")
        try:
            draft.unlink(missing_ok=True)
            os.close(os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # issue text
            conn = self._open(draft)
            try:
                self._prepare(conn)
            except sqlite3.Error as exc:
                raise self._fail(exc, "creating it") from exc
            finally:
                conn.close()
            with contextlib.suppress(FileExistsError):  # another process was first: use theirs
                os.link(draft, self.db_path)
        except OSError as exc:
            raise TrackerDatabaseError(
                f"cannot create the tracker database {self.db_path}: {exc.strerror}"
            ) from exc
        finally:
            draft.unlink(missing_ok=True)

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
                        ("created_at", iso(utc_now())),
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

    def version(self) -> tuple[int, int, int] | None:
        """Which file the database is and how many commits it has seen since this
        object first looked (SQLite's ``data_version`` on a connection kept for it:
        another connection's commit, from any process, changes it); None when it cannot
        say. Equal versions, equal contents: a reader may answer from what it read."""
        try:
            stat = self.db_path.stat()
        except OSError:
            return None
        where = (stat.st_dev, stat.st_ino)
        with self._probe_lock:
            try:
                if self._probe is None or self._probe[0] != where:  # first, or replaced
                    self._close_probe()
                    self._probe = (where, self._open(self.db_path))
                (changes,) = self._probe[1].execute("PRAGMA data_version").fetchone()
            except (sqlite3.Error, TrackerError):
                self._close_probe()
                return None
        return (*where, int(changes))

    def _close_probe(self) -> None:
        if self._probe is not None:
            self._probe[1].close()
            self._probe = None

    def close(self) -> None:
        with self._probe_lock:
            self._close_probe()

    def call(self, doing: str, func: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._connect()
        try:
            return func(conn)
        except sqlite3.Error as exc:
            raise self._fail(exc, doing) from exc
        finally:
            conn.close()

    def write_call(self, doing: str, func: Callable[[sqlite3.Connection], T]) -> T:
        def inside(conn: sqlite3.Connection) -> T:
            with self._write(conn):
                return func(conn)

        return self.call(doing, inside)

    # --- identifiers -------------------------------------------------------------

    def number(self, identifier: str) -> int:
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

    def ident(self, number: int) -> str:
        return f"{self.key}-{number}"

    def existing(self, conn: sqlite3.Connection, identifier: str) -> int:
        number = self.number(identifier)
        if not conn.execute("SELECT 1 FROM issues WHERE number = ?", (number,)).fetchone():
            raise UnknownIssue(f"no issue {identifier} in {self.db_path}")
        return number

    # --- reading -----------------------------------------------------------------

    def states(self, conn: sqlite3.Connection) -> list[sqlite3.Row]:
        return list(conn.execute("SELECT position, name, type FROM states ORDER BY position"))

    def resolve_state(
        self, conn: sqlite3.Connection, name: str | None, type: StateType | str | None
    ) -> int:
        """The position of the state called ``name`` (any case) or the first of ``type``."""
        states = self.states(conn)
        valid = ", ".join(f"{r['name']} ({r['type']})" for r in states)
        if (name is None) == (type is None):
            raise TrackerInputError("give exactly one of a state name or a state type")
        if name is not None:
            for row in states:
                if row["name"].casefold() == name.strip().casefold():
                    return int(row["position"])
            raise TrackerInputError(f"unknown state {name!r}; valid states: {valid}")
        try:
            wanted = StateType(str(type))
        except ValueError:
            raise TrackerInputError(
                f"unknown state type {type!r}; valid types: {', '.join(StateType)}"
            ) from None
        for row in states:
            if row["type"] == wanted.value:
                return int(row["position"])
        raise TrackerInputError(f"no state of type {wanted.value!r}; valid states: {valid}")

    def edges(self, conn: sqlite3.Connection) -> dict[str, set[str]]:
        """Existing relations as identifier → identifiers it is blocked by."""
        edges: dict[str, set[str]] = {}
        for row in conn.execute("SELECT blocker, blocked FROM blocks"):
            edges.setdefault(self.ident(row[1]), set()).add(self.ident(row[0]))
        return edges

    def parents(self, conn: sqlite3.Connection) -> dict[str, str]:
        """Existing sub-issues as identifier → its parent's identifier."""
        return {self.ident(row[0]): self.ident(row[1]) for row in
                conn.execute("SELECT number, parent FROM issues WHERE parent IS NOT NULL")}

    def touch(self, conn: sqlite3.Connection, number: int) -> None:
        conn.execute(
            "UPDATE issues SET updated_at = ? WHERE number = ?", (iso(utc_now()), number)
        )
