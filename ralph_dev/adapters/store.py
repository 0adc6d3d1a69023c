"""ralph-dev's own files: worker records, the events log, the heartbeat.

These are caches and history (the tracker, jj and tmux are the truth), so a
missing or corrupt file is ignored or rebuilt, never fatal. Records and the
heartbeat are written atomically; events are appended one JSON line at a time
with ``O_APPEND`` so concurrent writers (controller, workers' commands) never
interleave within a line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from ralph_dev.adapters.files import atomic_write_text, flocked, private_dir, read_lines_from
from ralph_dev.core.model import (
    NodeSlots,
    Pause,
    Role,
    Window,
    WorkerRecord,
    check_identifier,
)
from ralph_dev.core.paths import ProjectPaths

log = structlog.get_logger(__name__)


def utcnow() -> datetime:
    return datetime.now(UTC)


def to_iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def from_iso(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


EVENTS_CAP = 64 * 2**20
"""Bytes of ``events.jsonl`` before it is rotated to ``events.jsonl.1`` (one kept)."""
PANE_LOG_CAP = 16 * 2**20
"""Bytes of a worker's pane log before it is rotated to ``ISSUE.log.1`` (one kept)."""

_DATETIME_FIELDS = {
    f.name for f in dataclasses.fields(WorkerRecord) if "datetime" in str(f.type)
}


_FIELDS = [f.name for f in dataclasses.fields(WorkerRecord)]
FACT_SOURCES = ("reports", "observer", "daemon", "carrier")
"""Who notes facts about a worker beside its record: the controller's intake (what the
worker said), its observer (what its pane shows), the daemon (its tmux session went),
the cluster mailbox carrier (its host answered: the attempt's lease renewed)."""
WRITTEN, BORN = "_written", "_born"
"""In a record's file: when the actuator wrote each field; when it made the record."""
NEVER = datetime.min.replace(tzinfo=UTC)


def _times(data: Mapping[str, Any]) -> dict[str, Any]:
    """When the actuator wrote each field of a record's file (none known: {})."""
    written = data.get(WRITTEN)
    return written if isinstance(written, dict) else {}


def _field_json(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return value.value if isinstance(value, Role) else value


def _dumps(data: Mapping[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside ``path`` for one read-modify-write of it."""
    lock_path = path.with_name(f".{path.name}.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with flocked(lock_path):
        yield


def record_to_json(record: WorkerRecord) -> dict[str, Any]:
    return {name: _field_json(getattr(record, name)) for name in _FIELDS}


def record_from_json(data: Mapping[str, Any]) -> WorkerRecord:
    """Build a record from JSON, tolerating unknown/missing/mistyped fields."""
    issue = check_identifier(str(data.get("issue", "")))
    kwargs: dict[str, Any] = {"issue": issue}
    if "cluster_attempt" in data and "host_attempt" not in data:  # its name before 0.x
        data = {**data, "host_attempt": data["cluster_attempt"]}
    defaults = WorkerRecord(issue=issue)
    for f in dataclasses.fields(WorkerRecord):
        if f.name == "issue" or f.name not in data:
            continue
        value = data[f.name]
        default = getattr(defaults, f.name)
        if f.name in _DATETIME_FIELDS:
            value = from_iso(value)
        elif f.name == "role":
            try:
                value = Role(value)
            except ValueError:
                value = Role.EXECUTE
        elif isinstance(default, bool):
            value = bool(value)
        elif isinstance(default, int):
            value = int(value) if isinstance(value, int | float) else default
        elif value is not None and not isinstance(value, str):
            value = str(value)
        kwargs[f.name] = value
    return WorkerRecord(**kwargs)


class StateStore:
    """Read and write one project's state directory."""

    def __init__(self, paths: ProjectPaths) -> None:
        self.paths = paths
        for directory in paths.private_roots():
            private_dir(directory)

    # -- worker records --

    def record_path(self, issue: str) -> Path:
        return self.paths.records_dir / f"{check_identifier(issue)}.json"

    def facts_path(self, issue: str, source: str) -> Path:
        if source not in FACT_SOURCES:
            raise ValueError(f"{source!r} is not one of {FACT_SOURCES}")
        return self.paths.records_dir / "facts" / f"{check_identifier(issue)}.{source}.json"

    def _read_json(self, path: Path) -> dict[str, Any] | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("record_corrupt", path=str(path), error=str(exc))
            return None
        return data if isinstance(data, dict) else None

    def load_record(self, issue: str) -> WorkerRecord | None:
        """The actuator's record with the facts noted since folded in, each field the
        value written last (``note_facts``)."""
        data = self._read_json(self.record_path(issue))
        if data is None:
            return None
        try:
            record = record_from_json(data)
        except (ValueError, TypeError, AttributeError) as exc:
            log.warning("record_corrupt", issue=issue, error=str(exc))
            return None
        if record.issue != issue:
            return None
        folded = record_to_json(record)
        written = _times(data)
        born = from_iso(data.get(BORN)) or NEVER
        times = {name: from_iso(written.get(name)) or NEVER for name in folded}
        for source in FACT_SOURCES:
            for name, entry in (self._read_json(self.facts_path(issue, source)) or {}).items():
                at = from_iso(entry.get("at")) if isinstance(entry, dict) else None
                # a fact from before this record was made is an earlier worker's
                if name in times and name != "issue" and at is not None and at >= born \
                        and at > times[name]:
                    folded[name], times[name] = entry.get("value"), at
        return record_from_json(folded)

    def save_record(self, record: WorkerRecord) -> None:
        atomic_write_text(self.record_path(record.issue), _dumps(record_to_json(record)))

    def update_record(self, issue: str, **changes: Any) -> WorkerRecord:
        """Load (or start) the actuator's record, apply ``changes`` and save it, each
        changed field stamped with when (the fold weighs them against noted facts); the
        folded record after it.

        The actuator is the record's one writer; what workers say and what observers
        see are facts (``note_facts``) read at the next load, so no writer can drop
        another's field, and no read-modify-write spans two processes.
        """
        path = self.record_path(issue)
        with _locked(path):
            data = self._read_json(path) or {}
            try:
                current = record_from_json(data) if data.get("issue") == issue else None
            except ValueError:
                current = None
            updated = dataclasses.replace(current or WorkerRecord(issue=issue), **changes)
            now = to_iso(utcnow())
            written = _times(data) if current else {}
            atomic_write_text(path, _dumps({
                **record_to_json(updated), BORN: data.get(BORN) if current else now,
                WRITTEN: {**written, **dict.fromkeys(changes, now)}}))
        return self.load_record(issue) or updated

    def note_facts(self, issue: str, source: str, **facts: Any) -> None:
        """What ``source`` learned of the issue's worker (a report, what a pane shows):
        kept beside the record, never in it, and folded in by the next load. Each
        source has one writer; every fact is stamped with when it was noted."""
        if not facts:
            return
        unknown = set(facts) - set(_FIELDS) - {"issue"}
        if unknown or "issue" in facts:
            raise ValueError(f"not worker-record fields: {sorted(unknown or {'issue'})}")
        path = self.facts_path(issue, source)
        path.parent.mkdir(parents=True, exist_ok=True)
        now = to_iso(utcnow())
        with _locked(path):
            known = self._read_json(path) or {}
            atomic_write_text(path, _dumps({**known, **{
                name: {"value": _field_json(value), "at": now}
                for name, value in facts.items()}}))

    def delete_record(self, issue: str) -> None:
        self.record_path(issue).unlink(missing_ok=True)
        for source in FACT_SOURCES:
            self.facts_path(issue, source).unlink(missing_ok=True)

    def load_records(self) -> dict[str, WorkerRecord]:
        records: dict[str, WorkerRecord] = {}
        try:
            entries = list(self.paths.records_dir.iterdir())
        except FileNotFoundError:
            return records
        for path in entries:
            if path.suffix != ".json" or path.name.startswith("."):
                continue
            try:
                check_identifier(path.stem)
            except ValueError:
                continue
            record = self.load_record(path.stem)
            if record is not None:
                records[record.issue] = record
        return records

    # -- events --

    def append_event(self, event: str, *, issue: str | None = None,
                     **details: Any) -> dict[str, Any]:
        entry: dict[str, Any] = {"time": utcnow().isoformat(), "event": event}
        if issue is not None:
            entry["issue"] = issue
        entry.update({k: _jsonable(v) for k, v in details.items()})
        line = json.dumps(entry, sort_keys=False) + "\n"
        path = self.paths.events_file
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            if path.stat().st_size > EVENTS_CAP:  # offset readers finish the old log first
                path.replace(path.with_name(path.name + ".1"))
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)
        return entry

    def rotate_log(self, issue: str, cap: int = PANE_LOG_CAP) -> bool:
        """Keep a worker's pane log under ``cap``: copy it to ``LOG.1`` and truncate it
        in place (tmux's ``cat >>`` keeps appending to the same file). True if rotated."""
        path = self.log_path(issue)
        try:
            if path.stat().st_size <= cap:
                return False
            shutil.copyfile(path, path.with_name(path.name + ".1"))
            os.truncate(path, 0)
        except OSError:
            return False
        return True

    def iter_events(self) -> Iterator[dict[str, Any]]:
        """Every readable event, oldest first; torn or corrupt lines are skipped."""
        try:
            handle = self.paths.events_file.open(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return
        with handle:
            for line in handle:
                entry = _event_from_line(line)
                if entry is not None:
                    yield entry

    def recent_events(self, count: int, *, chunk: int = 65536) -> list[dict[str, Any]]:
        """The newest ``count`` events, oldest first, read from the end of the log (a
        months-long log costs no more than a fresh one)."""
        if count <= 0:
            return []
        try:
            handle = self.paths.events_file.open("rb")
        except FileNotFoundError:
            return []
        with handle:
            position = os.fstat(handle.fileno()).st_size
            data = b""
            events: list[dict[str, Any]] = []
            while position > 0 and len(events) < count:
                step = min(chunk, position)
                position -= step
                handle.seek(position)
                data = handle.read(step) + data
                lines = data.decode("utf-8", "replace").splitlines()
                if position > 0:
                    lines = lines[1:]  # the first line may be cut in half
                events = [e for line in lines if (e := _event_from_line(line)) is not None]
        return events[-count:]

    def events_size(self) -> int:
        """The events log's length in bytes: where a reader that wants only news starts."""
        try:
            return self.paths.events_file.stat().st_size
        except OSError:
            return 0

    def read_events_from(self, offset: int, *, max_bytes: int = 4 << 20
                         ) -> tuple[list[dict[str, Any]], int]:
        """Events appended since byte ``offset``, and the offset to continue from.

        Long-lived readers (the daemon's metrics, notifier and dashboard, ``events -f``,
        pattern learning) poll with this instead of re-reading the whole log. A line
        still being written (no newline yet) is left for the next call. A log that
        shrank under the reader was rotated: what it had not read of the old log
        (``events.jsonl.1``) comes first, then the new log from its start. At most
        ``max_bytes`` are read per call, so catching up never holds it all.
        """
        current = self.paths.events_file
        try:
            size = current.stat().st_size
        except FileNotFoundError:
            return [], 0
        if offset > size:
            events, after = _read_lines(current.with_name(current.name + ".1"), offset,
                                        max_bytes)
            if after > offset:
                return events, after  # still in the old log while the new one is shorter
            offset = 0
        return _read_lines(current, offset, max_bytes)

    # -- swarm-wide pauses --

    def load_pauses(self) -> tuple[Pause, ...]:
        """The pauses in force (``pauses.json``); unreadable means none, never a crash."""
        try:
            raw = json.loads(self.paths.pauses_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return ()
        pauses = []
        for kind, data in (raw.items() if isinstance(raw, dict) else ()):
            if isinstance(data, dict):
                pauses.append(Pause(kind=str(kind), cause=str(data.get("cause", "")),
                                    fix=str(data.get("fix", "")), since=from_iso(data.get("since")),
                                    until=from_iso(data.get("until")),
                                    quiet_workers=bool(data.get("quiet_workers")),
                                    probe=str(data["probe"]) if data.get("probe") else None,
                                    shared_from=str(data.get("shared_from") or "")))
        return tuple(pauses)

    def set_pause(self, pause: Pause) -> bool:
        """Pause dispatch for ``pause.kind`` (replacing an older one of that kind); one
        ``swarm_paused`` event when it starts or its cause changes. True when new."""
        with self._pauses_locked():
            current = {p.kind: p for p in self.load_pauses()}
            old = current.get(pause.kind)
            if old is not None and (old.cause, old.until, old.probe, old.shared_from) == (
                    pause.cause, pause.until, pause.probe, pause.shared_from):
                return False
            since = old.since if old is not None else (pause.since or utcnow())
            current[pause.kind] = dataclasses.replace(pause, since=since)
            self._save_pauses(current)
        self.append_event("swarm_paused", kind=pause.kind, cause=pause.cause, fix=pause.fix,
                          until=pause.until, probe=pause.probe,
                          shared_from=pause.shared_from or None)
        return old is None

    def clear_pause(self, kind: str, *, why: str) -> bool:
        """End the pause of ``kind``: one ``swarm_resumed`` event. True when there was one."""
        with self._pauses_locked():
            current = {p.kind: p for p in self.load_pauses()}
            ended = current.pop(kind, None)
            if ended is None:
                return False
            self._save_pauses(current)
        self.append_event("swarm_resumed", kind=kind, cause=ended.cause, why=why)
        return True

    def _save_pauses(self, pauses: Mapping[str, Pause]) -> None:
        data = {kind: {"cause": p.cause, "fix": p.fix, "since": to_iso(p.since),
                       "until": to_iso(p.until), "quiet_workers": p.quiet_workers,
                       "probe": p.probe, "shared_from": p.shared_from}
                for kind, p in pauses.items()}
        atomic_write_text(self.paths.pauses_file, json.dumps(data, indent=1) + "\n")

    @contextlib.contextmanager
    def _pauses_locked(self) -> Iterator[None]:
        lock = self.paths.state_dir / ".pauses.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        with flocked(lock):
            yield

    # -- heartbeat --

    def write_heartbeat(self, **details: Any) -> None:
        data = {"time": utcnow().isoformat(), "pid": os.getpid(), **details}
        atomic_write_text(self.paths.heartbeat_file, json.dumps(data, default=str) + "\n")

    def read_heartbeat(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.paths.heartbeat_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or from_iso(data.get("time")) is None:
            return None
        data["time"] = from_iso(data["time"])
        return data

    def write_waits(self, waits: Mapping[str, Any]) -> None:
        """What each waiting issue waits on, as the controller's last plan said
        (``waits.json``: ``status`` and the dashboard show it)."""
        atomic_write_text(self.paths.state_dir / "waits.json",
                          json.dumps(waits, default=str, sort_keys=True) + "\n")

    def read_waits(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads((self.paths.state_dir / "waits.json").read_text("utf-8"))
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in data.items() if isinstance(v, dict)} \
            if isinstance(data, dict) else {}

    def write_cluster(self, windows: Sequence[Window], free_slots: int,
                      nodes: Sequence[NodeSlots] = ()) -> None:
        """The cluster's workers and free slots as the controller last saw them
        (``cluster.json``): ``status`` shows them without connecting to the cluster."""
        seen = [{"name": w.name, "pane_id": w.pane_id, "alive": w.alive,
                 "exit_status": w.exit_status, "command": w.command,
                 "host_lost": w.host_lost} for w in windows]
        atomic_write_text(self.paths.state_dir / "cluster.json",
                          json.dumps({"windows": seen, "free_slots": free_slots,
                                      "nodes": [dataclasses.asdict(n) for n in nodes]})
                          + "\n")

    def read_cluster(self) -> tuple[list[Window], int | None, list[NodeSlots]]:
        try:
            data = json.loads((self.paths.state_dir / "cluster.json").read_text("utf-8"))
            windows = [Window(name=str(w["name"]), pane_id=str(w["pane_id"]),
                              window_id=str(w["pane_id"]), alive=bool(w["alive"]),
                              exit_status=w.get("exit_status"), command=str(w["command"]),
                              host_lost=bool(w.get("host_lost"))) for w in data["windows"]]
            nodes = [NodeSlots(node=str(n["node"]), host=str(n["host"]), slots=int(n["slots"]))
                     for n in data.get("nodes", ())]
            return windows, int(data["free_slots"]), nodes
        except (OSError, ValueError, KeyError, TypeError):
            return [], None, []

    def log_path(self, issue: str) -> Path:
        return self.paths.logs_dir / f"{check_identifier(issue)}.log"


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Role):
        return value.value
    if isinstance(value, tuple | list | set | frozenset):
        return [_jsonable(v) for v in value]
    return value


def _read_lines(path: Path, offset: int, max_bytes: int) -> tuple[list[dict[str, Any]], int]:
    """The whole event lines from ``offset`` on (at most ``max_bytes``), and where they end."""
    lines, end = read_lines_from(path, offset, max_bytes)
    return [entry for line in lines
            if (entry := _event_from_line(line.decode("utf-8", "replace"))) is not None], end


def _event_from_line(line: str) -> dict[str, Any] | None:
    """One events-log line as an event; None for a torn or corrupt line."""
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) and "event" in entry else None
