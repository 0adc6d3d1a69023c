"""ralph-dev's own files: records, events and heartbeat survive damage and concurrency."""

from __future__ import annotations

import json
import multiprocessing
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ralph_dev.adapters.store import StateStore
from ralph_dev.core.model import Role, WorkerRecord
from ralph_dev.core.paths import ProjectPaths


@pytest.fixture
def store(xdg: Path) -> StateStore:
    return StateStore(ProjectPaths("demo"))


def test_record_round_trip(store: StateStore) -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    record = WorkerRecord(issue="DEMO-1", role=Role.REVIEW, attempts=2, started_at=when,
                          done=True, summary="ok", iterations=3)
    store.save_record(record)
    assert store.load_record("DEMO-1") == record
    assert store.load_records() == {"DEMO-1": record}


def test_missing_record_is_none(store: StateStore) -> None:
    assert store.load_record("DEMO-1") is None
    assert store.load_records() == {}


@pytest.mark.parametrize("content", [
    "{not json", "", "[1, 2]", '{"issue": "../etc"}', '{"issue": "DEMO-2"}', "\x00\xff",
    '{"issue": "DEMO-1", "attempts": "many", "role": "boss", "started_at": "yesterday"}',
])
def test_corrupt_record_is_ignored_or_rebuilt(store: StateStore, content: str) -> None:
    path = store.record_path("DEMO-1")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8", errors="surrogateescape")
    store.save_record(WorkerRecord(issue="DEMO-3", attempts=1))

    loaded = store.load_record("DEMO-1")
    if loaded is not None:  # tolerable garbage is repaired field by field, never trusted blindly
        assert loaded.issue == "DEMO-1" and loaded.attempts == 0 and loaded.role is Role.EXECUTE
        assert loaded.started_at is None
    assert "DEMO-3" in store.load_records()  # one bad file does not hide the others
    updated = store.update_record("DEMO-1", iterations=4)  # and it is rebuilt on the next write
    assert store.load_record("DEMO-1") == updated and updated.iterations == 4


def test_stray_files_in_the_records_dir_are_skipped(store: StateStore) -> None:
    store.save_record(WorkerRecord(issue="DEMO-1"))
    records_dir = store.paths.records_dir
    (records_dir / "notes.txt").write_text("hello")
    (records_dir / "bad name.json").write_text("{}")
    (records_dir / ".DEMO-1.json.abc.tmp").write_text("{half")
    assert list(store.load_records()) == ["DEMO-1"]


def test_atomic_write_leaves_old_record_when_the_write_fails(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.save_record(WorkerRecord(issue="DEMO-1", attempts=1))

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch, pytest.raises(OSError):
        patch.setattr(os, "replace", broken_replace)
        store.save_record(WorkerRecord(issue="DEMO-1", attempts=2, summary="x" * 100_000))

    assert store.load_record("DEMO-1").attempts == 1
    assert [p.name for p in store.paths.records_dir.iterdir()] == ["DEMO-1.json"]  # no temp left


def _rewrite_records(state_home: str, rounds: int) -> None:
    os.environ["XDG_STATE_HOME"] = state_home
    store = StateStore(ProjectPaths("demo"))
    for i in range(rounds):
        store.save_record(WorkerRecord(issue="DEMO-1", attempts=i, summary="y" * (i % 7 * 5000)))


def test_readers_never_see_a_partial_record(store: StateStore, xdg: Path) -> None:
    store.save_record(WorkerRecord(issue="DEMO-1"))
    path = store.record_path("DEMO-1")
    ctx = multiprocessing.get_context("spawn")
    writer = ctx.Process(target=_rewrite_records, args=(str(xdg / "state"), 300))
    writer.start()
    reads = 0
    try:
        while writer.is_alive() or reads < 50:
            json.loads(path.read_text(encoding="utf-8"))  # raises on a torn file
            reads += 1
    finally:
        writer.join(timeout=60)
    assert writer.exitcode == 0
    assert store.load_record("DEMO-1").attempts == 299


def _append_events(state_home: str, who: int, count: int) -> None:
    os.environ["XDG_STATE_HOME"] = state_home
    store = StateStore(ProjectPaths("demo"))
    for i in range(count):
        store.append_event("test", issue="DEMO-1", who=who, n=i, pad="z" * (200 + 37 * (i % 50)))


def test_concurrent_event_appends_from_processes_are_whole_lines(
    store: StateStore, xdg: Path
) -> None:
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_append_events, args=(str(xdg / "state"), who, 200))
               for who in range(4)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(timeout=60)
        assert p.exitcode == 0

    lines = store.paths.events_file.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 800
    entries = [json.loads(line) for line in lines]  # every line is one whole JSON object
    for who in range(4):
        assert sorted(e["n"] for e in entries if e["who"] == who) == list(range(200))
    assert len(list(store.iter_events())) == 800


def test_torn_event_lines_are_skipped(store: StateStore) -> None:
    store.append_event("first", issue="DEMO-1")
    with store.paths.events_file.open("a", encoding="utf-8") as handle:
        handle.write('{"time": "x", "event": "torn"\n[1,2]\n\n')
    store.append_event("second")
    assert [e["event"] for e in store.iter_events()] == ["first", "second"]


def test_reading_events_incrementally_by_offset(store: StateStore) -> None:
    assert store.read_events_from(0) == ([], 0)  # no log yet
    store.append_event("one")
    store.append_event("two", issue="DEMO-1")
    events, offset = store.read_events_from(0)
    assert [e["event"] for e in events] == ["one", "two"]
    assert offset == store.events_size()
    assert store.read_events_from(offset) == ([], offset)
    with store.paths.events_file.open("a", encoding="utf-8") as handle:
        handle.write('{"time": "t", "event": "half')  # a writer mid-line
    events, later = store.read_events_from(offset)
    assert events == [] and later == offset  # the torn tail waits for its newline
    with store.paths.events_file.open("a", encoding="utf-8") as handle:
        handle.write('way"}\n')
    events, later = store.read_events_from(offset)
    assert [e["event"] for e in events] == ["halfway"] and later == store.events_size()


def test_recent_events_read_from_the_end(store: StateStore) -> None:
    assert store.recent_events(5) == []
    for n in range(300):
        store.append_event("e", n=n, pad="p" * (n % 17))
    with store.paths.events_file.open("a", encoding="utf-8") as handle:
        handle.write("{torn\n")
    store.append_event("last")
    newest = store.recent_events(10, chunk=64)  # chunks far smaller than the lines
    assert [e.get("n") for e in newest] == [*range(291, 300), None]
    assert newest[-1]["event"] == "last"
    assert [e["n"] for e in store.recent_events(400)[:3]] == [0, 1, 2]
    assert store.recent_events(0) == []


def test_reading_events_after_the_log_was_replaced_starts_over(store: StateStore) -> None:
    for n in range(5):
        store.append_event("old", n=n)
    _, offset = store.read_events_from(0)
    store.paths.events_file.write_text('{"time": "t", "event": "new"}\n')
    events, _ = store.read_events_from(offset)
    assert [e["event"] for e in events] == ["new"]


def test_reading_events_in_bounded_chunks(store: StateStore) -> None:
    for n in range(50):
        store.append_event("e", n=n)
    seen, offset = [], 0
    while True:
        events, offset = store.read_events_from(offset, max_bytes=300)
        if not events:
            break
        seen += [e["n"] for e in events]
    assert seen == list(range(50))
    with store.paths.events_file.open("a", encoding="utf-8") as handle:
        handle.write("x" * 1000 + "\n")  # one line longer than a chunk: skipped, no stall
    store.append_event("after")
    names = []
    for _ in range(10):
        events, offset = store.read_events_from(offset, max_bytes=300)
        names += [e["event"] for e in events]
    assert names == ["after"]


def test_heartbeat_round_trip_and_garbage(store: StateStore) -> None:
    assert store.read_heartbeat() is None
    store.write_heartbeat(tick=3)
    beat = store.read_heartbeat()
    assert beat is not None and beat["tick"] == 3 and beat["time"].tzinfo is not None
    store.paths.heartbeat_file.write_text("garbage")
    assert store.read_heartbeat() is None
    store.paths.heartbeat_file.write_text('{"time": "not a time"}')
    assert store.read_heartbeat() is None


def test_pauses_are_kept_one_per_kind_and_said_once(xdg: Path) -> None:
    from ralph_dev.core.model import Pause

    store = StateStore(ProjectPaths("demo"))
    assert store.load_pauses() == ()
    limit = Pause(kind="usage_limit", cause="usage limit until 12:51", quiet_workers=True)
    assert store.set_pause(limit) is True
    assert store.set_pause(limit) is False  # the same again: no second event
    (stored,) = store.load_pauses()
    assert stored.cause == limit.cause and stored.quiet_workers and stored.since is not None
    assert store.clear_pause("usage_limit", why="reset passed") is True
    assert store.clear_pause("usage_limit", why="again") is False
    kinds = [e["event"] for e in store.iter_events()]
    assert kinds == ["swarm_paused", "swarm_resumed"]
    store.paths.pauses_file.write_text("{broken")
    assert store.load_pauses() == ()  # unreadable is no pause, never a crash


def test_a_pane_log_over_its_cap_is_rotated_in_place(store: StateStore) -> None:
    """Issue 13 item 6: logs do not grow without bound. tmux's `cat >>` keeps the file
    open, so the log is copied aside and truncated, never renamed."""
    log = store.log_path("DEMO-1")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"x" * 2000)
    with log.open("ab") as writer:  # as tmux's pipe-pane holds it
        assert not store.rotate_log("DEMO-1", cap=5000)
        assert store.rotate_log("DEMO-1", cap=1000)
        writer.write(b"after\n")
    assert log.read_bytes() == b"after\n"
    assert log.with_name(log.name + ".1").read_bytes() == b"x" * 2000


@pytest.mark.parametrize("max_bytes", [4 << 20, 300])
def test_the_events_log_rotates_and_offset_readers_miss_nothing(
        store: StateStore, monkeypatch: pytest.MonkeyPatch, max_bytes: int) -> None:
    """A reader from before the rotation (the notifier, metrics, pattern learning) gets
    what it had not read of the old log, then the new one: no event falls between."""
    monkeypatch.setattr("ralph_dev.adapters.store.EVENTS_CAP", 600)
    for n in range(3):
        store.append_event("spawn", issue=f"DEMO-{n}", reason="x" * 100)
    _, offset = store.read_events_from(0)
    for n in range(3, 6):  # DEMO-4 starts the new log
        store.append_event("spawn", issue=f"DEMO-{n}", reason="x" * 100)
    assert store.paths.events_file.with_name("events.jsonl.1").exists()
    assert store.paths.events_file.stat().st_size < offset  # the log shrank under the reader
    seen: list[str] = []
    for _ in range(20):
        events, offset = store.read_events_from(offset, max_bytes=max_bytes)
        seen += [e["issue"] for e in events]
    assert seen == [f"DEMO-{n}" for n in range(3, 6)]


def test_each_field_holds_what_was_written_last_by_the_actuator_or_a_fact(
        store: StateStore) -> None:
    store.update_record("DEMO-1", attempts=1, done=False, hang_restarts=2)
    store.note_facts("DEMO-1", "reports", done=True, hang_restarts=0, summary="did it")
    folded = store.load_record("DEMO-1")
    assert (folded.done, folded.hang_restarts, folded.summary, folded.attempts) \
        == (True, 0, "did it", 1)
    store.update_record("DEMO-1", done=False, attempts=2)  # a new start, after the report
    again = store.load_record("DEMO-1")
    assert (again.done, again.summary, again.attempts) == (False, "did it", 2)
    assert store.load_records() == {"DEMO-1": again}


def test_facts_of_a_forgotten_worker_never_reach_the_next(store: StateStore) -> None:
    store.update_record("DEMO-1", attempts=1)
    store.note_facts("DEMO-1", "daemon", lost="its tmux session went away")
    store.delete_record("DEMO-1")
    assert store.load_record("DEMO-1") is None
    store.note_facts("DEMO-1", "reports", done=True)  # a late report, after the forget
    assert store.load_record("DEMO-1") is None  # facts alone make no worker
    fresh = store.update_record("DEMO-1", attempts=1)
    assert not fresh.done and fresh.lost is None


def test_a_fact_must_name_a_record_field_and_a_known_source(store: StateStore) -> None:
    with pytest.raises(ValueError, match="not worker-record fields"):
        store.note_facts("DEMO-1", "reports", colour="red")
    with pytest.raises(ValueError, match="not one of"):
        store.note_facts("DEMO-1", "worker", done=True)
    with pytest.raises(ValueError):
        store.note_facts("../etc", "reports", done=True)


def _note_activity(state_home: str, rounds: int) -> None:
    os.environ["XDG_STATE_HOME"] = state_home
    store = StateStore(ProjectPaths("demo"))
    for i in range(rounds):
        store.note_facts("DEMO-1", "reports", iterations=i + 1)


def test_the_actuator_and_a_noting_process_never_drop_each_others_fields(
        store: StateStore, xdg: Path) -> None:
    store.update_record("DEMO-1", attempts=1)
    writer = multiprocessing.get_context("spawn").Process(
        target=_note_activity, args=(str(xdg / "state"), 200))
    writer.start()
    for i in range(200):
        store.update_record("DEMO-1", nudged_at=datetime(2026, 1, 1, tzinfo=UTC), attempts=i)
    writer.join(60)
    final = store.load_record("DEMO-1")
    assert (final.iterations, final.attempts) == (200, 199)
