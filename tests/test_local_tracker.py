"""The SQLite tracker against real SQLite files: data, relations, refusals, bad databases."""

from __future__ import annotations

import asyncio
import itertools
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path

import pytest
from conftest import assert_implements
from hypothesis import given, settings
from hypothesis import strategies as st

from ralph_dev.adapters.tracker import open_tracker
from ralph_dev.adapters.tracker.local import LocalTracker
from ralph_dev.adapters.tracker.local_db import TrackerDatabaseError
from ralph_dev.core.config import ProjectSettings, TrackerSettings
from ralph_dev.core.cycles import find_cycle
from ralph_dev.core.errors import ConfigError, TrackerError, TrackerInputError, UnknownIssue
from ralph_dev.core.model import InvalidIdentifier, NewIssue, StateType
from ralph_dev.core.ports import Tracker


def dump(db: Path) -> list[str]:
    """Every row of the database as SQL text: equal dumps mean nothing was written."""
    conn = sqlite3.connect(db)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "tracker.db"


@pytest.fixture
def tracker(db: Path) -> LocalTracker:
    return LocalTracker(db, "DEMO")


def make_readonly(path: Path) -> None:
    """Really read-only, also for root (who ignores file modes): the immutable flag."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(path)], check=True)
    else:
        path.chmod(0o444 if path.is_file() else 0o555)


def make_writable(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
        path.chmod(0o644 if path.is_file() else 0o755)


@pytest.fixture
def readonly() -> Iterator[list[Path]]:
    """Paths put here are made writable again afterwards, whatever happened."""
    paths: list[Path] = []
    yield paths
    for path in paths:
        make_writable(path)


async def test_is_a_tracker(tracker: LocalTracker) -> None:
    assert_implements(tracker, Tracker)
    assert await tracker.list_issues() == []
    await tracker.close()


async def test_create_and_read_back_every_field(tracker: LocalTracker) -> None:
    ids = await tracker.create_issues(
        [
            NewIssue(title="Phase 1", ref="p1", labels=("ralph:phase",)),
            NewIssue(
                title="Schema",
                ref="schema",
                parent="p1",
                description="Tables and\nindexes",
                priority=2,
                labels=("backend", "db"),
            ),
            NewIssue(title="API", ref="api", parent="p1", blocked_by=("schema",)),
            NewIssue(title="README", blocked_by=("api", "schema"), state="Backlog"),
        ]
    )
    assert ids == ["DEMO-1", "DEMO-2", "DEMO-3", "DEMO-4"]
    issues = {i.identifier: i for i in await tracker.list_issues()}
    phase, schema, api, readme = (issues[i] for i in ids)
    assert phase.children == ("DEMO-2", "DEMO-3")
    assert phase.labels == frozenset({"ralph:phase"})
    assert schema.parent == "DEMO-1" and schema.priority == 2
    assert schema.description == "Tables and\nindexes"
    assert schema.labels == frozenset({"backend", "db"})
    assert schema.state_name == "Todo" and schema.state_type is StateType.UNSTARTED
    assert api.blocked_by == ("DEMO-2",)
    assert readme.blocked_by == ("DEMO-2", "DEMO-3")
    assert readme.parent is None
    assert readme.state_name == "Backlog" and readme.state_type is StateType.BACKLOG
    assert schema.id == "DEMO-2"
    assert phase.sort_order < schema.sort_order < api.sort_order < readme.sort_order
    assert schema.created_at is not None and schema.created_at.tzinfo is not None
    assert schema.created_at.utcoffset() == UTC.utcoffset(None)
    assert (await tracker.get("DEMO-4")).title == "README"


async def test_identifiers_are_dense_and_never_reused(tracker: LocalTracker, db: Path) -> None:
    assert await tracker.create_issues([NewIssue(title="a"), NewIssue(title="b")]) == [
        "DEMO-1",
        "DEMO-2",
    ]
    with pytest.raises(TrackerInputError):
        await tracker.create_issues([NewIssue(title="c"), NewIssue(title="d", parent="DEMO-9")])
    assert await tracker.create_issues([NewIssue(title="c")]) == ["DEMO-3"]
    # Even if a row disappears (a person with the sqlite3 shell), its number stays used.
    conn = sqlite3.connect(db)
    conn.execute("DELETE FROM issues WHERE number = 3")
    conn.commit()
    conn.close()
    assert await tracker.create_issues([NewIssue(title="e")]) == ["DEMO-4"]


async def test_states_by_name_any_case_and_by_type(tracker: LocalTracker) -> None:
    [ident] = await tracker.create_issues([NewIssue(title="x")])
    issue = await tracker.set_state(ident, name="in review")
    assert (issue.state_name, issue.state_type) == ("In Review", StateType.STARTED)
    issue = await tracker.set_state(ident, type=StateType.STARTED)
    assert issue.state_name == "In Progress"  # the first started state by position
    issue = await tracker.set_state(ident, type=StateType.COMPLETED)
    assert issue.state_name == "Done" and issue.state_type.finished
    with pytest.raises(TrackerInputError) as err:
        await tracker.set_state(ident, name="Shipped")
    assert "Shipped" in str(err.value) and "In Review (started)" in str(err.value)
    with pytest.raises(TrackerInputError):
        await tracker.set_state(ident, type=StateType.TRIAGE)
    with pytest.raises(TrackerInputError):
        await tracker.set_state(ident)


async def test_updated_bumps_on_every_change_and_only_then(tracker: LocalTracker) -> None:
    [ident] = await tracker.create_issues([NewIssue(title="x")])
    before = (await tracker.get(ident)).updated_at
    assert before is not None

    async def changed(coro: object) -> bool:
        nonlocal before
        await coro  # type: ignore[misc]
        now = (await tracker.get(ident)).updated_at
        assert now is not None
        moved = now > before
        before = now
        return moved

    assert await changed(tracker.comment(ident, "hello"))
    assert await changed(tracker.add_labels(ident, ["a"]))
    assert not await changed(tracker.add_labels(ident, ["a"]))  # already there
    assert await changed(tracker.remove_labels(ident, ["a"]))
    assert not await changed(tracker.remove_labels(ident, ["absent"]))
    assert await changed(tracker.set_state(ident, name="Done"))
    assert not await changed(tracker.set_state(ident, name="done"))
    # A new child changes its parent.
    assert await changed(tracker.create_issues([NewIssue(title="child", parent=ident)]))


async def test_labels_are_incremental(tracker: LocalTracker) -> None:
    [ident] = await tracker.create_issues([NewIssue(title="x", labels=("keep",))])
    issue = await tracker.add_labels(ident, ["user-input-needed", "model:opus"])
    assert issue.labels == {"keep", "user-input-needed", "model:opus"}
    issue = await tracker.remove_labels(ident, ["user-input-needed", "never-there"])
    assert issue.labels == {"keep", "model:opus"}
    issue = await tracker.change_labels(ident, add=["b"], remove=["keep"])
    assert issue.labels == {"model:opus", "b"}
    for bad in ("", "  ", "a\nb", "x" * 81):
        with pytest.raises(TrackerInputError):
            await tracker.add_labels(ident, [bad])


async def test_comments_oldest_first_with_authors(
    tracker: LocalTracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("USER", "alice")
    [ident] = await tracker.create_issues([NewIssue(title="x")])
    await tracker.comment(ident, "first, from ralph")
    await tracker.comment(ident, "second, from alice", by_ralph=False)
    await tracker.comment(ident, "third, from bob", by_ralph=False, author="bob")
    comments = (await tracker.get(ident)).comments
    assert [(c.author, c.by_ralph) for c in comments] == [
        ("ralph-dev", True),
        ("alice", False),
        ("bob", False),
    ]
    assert comments[0].body == "first, from ralph"
    assert comments[0].created_at <= comments[1].created_at <= comments[2].created_at
    assert all(c.created_at.tzinfo is not None for c in comments)
    with pytest.raises(TrackerInputError):
        await tracker.comment(ident, "   ")


@pytest.mark.parametrize(
    "bad",
    ["../x", "A-1; rm -rf /", "", "DEMO-1" + "x" * 10_000, "demo-1", "DEMO-0", "DEMO-1\n"],
)
async def test_bad_identifiers_are_refused(tracker: LocalTracker, db: Path, bad: str) -> None:
    await tracker.create_issues([NewIssue(title="x")])
    before = dump(db)
    for call in (
        tracker.get(bad),
        tracker.comment(bad, "hi"),
        tracker.add_labels(bad, ["a"]),
        tracker.set_state(bad, name="Done"),
    ):
        with pytest.raises(InvalidIdentifier) as err:
            await call
        assert len(str(err.value)) < 300
    assert dump(db) == before


async def test_other_projects_and_unknown_issues(tracker: LocalTracker, db: Path) -> None:
    await tracker.create_issues([NewIssue(title="x")])
    before = dump(db)
    with pytest.raises(TrackerInputError, match="another project"):
        await tracker.get("OTHER-1")
    with pytest.raises(TrackerInputError, match="another project"):
        await tracker.create_issues([NewIssue(title="y", blocked_by=("OTHER-1",))])
    with pytest.raises(TrackerInputError, match="another project"):
        await tracker.create_issues([NewIssue(title="y", parent="OTHER-1")])
    with pytest.raises(UnknownIssue, match="DEMO-7"):
        await tracker.get("DEMO-7")
    with pytest.raises(UnknownIssue, match="DEMO-7"):
        await tracker.comment("DEMO-7", "hi")
    with pytest.raises(UnknownIssue, match="DEMO-7"):
        await tracker.create_issues([NewIssue(title="y", blocked_by=("DEMO-7",))])
    assert dump(db) == before


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        (
            [NewIssue("a", ref="a", blocked_by=("b",)), NewIssue("b", ref="b", blocked_by=("a",))],
            "a → b → a",
        ),
        ([NewIssue("a", ref="a", blocked_by=("a",))], "a → a"),
        (
            [
                NewIssue("a", ref="a", blocked_by=("c",)),
                NewIssue("b", ref="b", blocked_by=("a",)),
                NewIssue("c", ref="c", blocked_by=("b", "DEMO-1")),
            ],
            "a → c → b → a",
        ),
        ([NewIssue("a", ref="a", parent="b"), NewIssue("b", ref="b", parent="a")], "parent cycle"),
        (  # a task blocked by its own phase would wait forever (so would the phase)
            [NewIssue("phase", ref="p"), NewIssue("t", ref="t", parent="p", blocked_by=("p",))],
            "dependency cycle p → t → p",
        ),
        ([NewIssue("sub", parent="DEMO-1", blocked_by=("DEMO-1",))],
         "dependency cycle DEMO-1 → 'sub' → DEMO-1"),
        ([NewIssue("a", blocked_by=("nope",))], "neither an issue identifier nor a ref"),
        ([NewIssue("a", ref="x"), NewIssue("b", ref="x")], "used twice"),
        ([NewIssue("a", ref="DEMO-5")], "looks like an issue identifier"),
        ([NewIssue("a", priority=5)], "not 0-4"),
        ([NewIssue("  ")], "title is empty"),
        ([NewIssue("a", state="Shipped")], "unknown state"),
        ([NewIssue("ok"), NewIssue("a", labels=("",))], "empty"),
    ],
)
async def test_refused_batches_write_nothing(
    tracker: LocalTracker, db: Path, batch: list[NewIssue], message: str
) -> None:
    await tracker.create_issues([NewIssue(title="existing")])
    before = dump(db)
    with pytest.raises(TrackerInputError) as err:
        await tracker.create_issues(batch)
    assert message in str(err.value)
    assert dump(db) == before
    assert await tracker.create_issues([NewIssue(title="next")]) == ["DEMO-2"]


async def test_blocker_cycle_through_existing_relations(tracker: LocalTracker, db: Path) -> None:
    await tracker.create_issues(
        [
            NewIssue("one", ref="one"),
            NewIssue("two", ref="two", blocked_by=("one",)),
            NewIssue("three", blocked_by=("two",)),
        ]
    )
    before = dump(db)
    with pytest.raises(TrackerInputError) as err:
        await tracker.add_blocker("DEMO-1", "DEMO-3")
    assert "DEMO-1 → DEMO-3 → DEMO-2 → DEMO-1" in str(err.value)
    with pytest.raises(TrackerInputError, match="DEMO-2 → DEMO-2"):
        await tracker.add_blocker("DEMO-2", "DEMO-2")

    assert dump(db) == before
    issue = await tracker.add_blocker("DEMO-3", "DEMO-1")
    assert issue.blocked_by == ("DEMO-1", "DEMO-2")
    assert (await tracker.add_blocker("DEMO-3", "DEMO-1")).blocked_by == ("DEMO-1", "DEMO-2")
    assert (await tracker.remove_blocker("DEMO-3", "DEMO-2")).blocked_by == ("DEMO-1",)


def test_find_cycle() -> None:
    assert find_cycle({}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    chain = {f"n{i}": {f"n{i + 1}"} for i in range(5000)}  # no recursion limit
    assert find_cycle(chain) is None
    chain["n5000"] = {"n0"}
    cycle = find_cycle(chain)
    assert cycle is not None and cycle[0] == cycle[-1] and len(cycle) == 5002


async def test_key_is_stored_and_checked(tracker: LocalTracker, db: Path) -> None:
    await tracker.create_issues([NewIssue(title="x")])
    other = LocalTracker(db, "OTHER")
    with pytest.raises(TrackerDatabaseError, match="key 'DEMO'") as err:
        await other.list_issues()
    assert "tracker.key" in str(err.value)
    conn = sqlite3.connect(db)
    meta = dict(conn.execute("SELECT name, value FROM meta"))
    conn.close()
    assert meta["key"] == "DEMO" and meta["schema_version"] == "1"


@pytest.mark.parametrize("key", ["", "demo", "A-1", "TOOLONGKEY11", "../X"])
def test_bad_keys(db: Path, key: str) -> None:
    with pytest.raises(TrackerInputError, match="tracker key"):
        LocalTracker(db, key)
    assert not db.parent.exists()


async def test_wal_and_busy_timeout(tracker: LocalTracker, db: Path) -> None:
    await tracker.list_issues()
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


@pytest.mark.parametrize(
    "content",
    [b"hello, this is not a database\n" * 50, b"SQLite format 3\x00" + b"\xff" * 200],
)
async def test_not_a_sqlite_file(db: Path, content: bytes) -> None:
    db.parent.mkdir(parents=True)
    db.write_bytes(content)
    with pytest.raises(TrackerDatabaseError) as err:
        await LocalTracker(db, "DEMO").list_issues()
    assert str(db) in str(err.value) and "move it aside" in str(err.value)
    assert db.read_bytes() == content


async def test_damaged_database(tracker: LocalTracker, db: Path) -> None:
    await tracker.create_issues([NewIssue("t" * 500, description="x" * 3000) for _ in range(30)])
    data = bytearray(db.read_bytes())
    assert len(data) > 4096 * 6  # checkpointed into the main file on close
    data[4096 * 3 : 4096 * 5] = b"\xab" * 8192
    db.write_bytes(bytes(data))
    with pytest.raises(TrackerDatabaseError) as err:
        await LocalTracker(db, "DEMO").list_issues()
    assert "damaged" in str(err.value) and str(db) in str(err.value)


async def test_someone_elses_sqlite_file(db: Path) -> None:
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE photos (id INTEGER)")
    conn.commit()
    conn.close()
    before = dump(db)
    with pytest.raises(TrackerDatabaseError, match="not a ralph-dev tracker"):
        await LocalTracker(db, "DEMO").create_issues([NewIssue(title="x")])
    assert dump(db) == before


async def test_read_only_database(tracker: LocalTracker, db: Path, readonly: list[Path]) -> None:
    await tracker.create_issues([NewIssue(title="x")])
    before = dump(db)
    make_readonly(db)
    readonly.append(db)
    fresh = LocalTracker(db, "DEMO")
    assert [i.identifier for i in await fresh.list_issues()] == ["DEMO-1"]  # reads still work
    for call in (
        fresh.create_issues([NewIssue(title="y"), NewIssue(title="z")]),
        fresh.comment("DEMO-1", "hi"),
        fresh.set_state("DEMO-1", name="Done"),
    ):
        with pytest.raises(TrackerDatabaseError) as err:
            await call
        assert "read-only" in str(err.value) and str(db) in str(err.value)
        assert not err.value.retryable
    make_writable(db)
    readonly.remove(db)
    assert dump(db) == before


async def test_unwritable_directory_for_a_new_database(
    tmp_path: Path, readonly: list[Path]
) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    make_readonly(folder)
    readonly.append(folder)
    with pytest.raises(TrackerError) as err:
        await LocalTracker(folder / "tracker.db", "DEMO").list_issues()
    assert str(folder) in str(err.value)
    assert list(folder.iterdir()) == []


async def test_concurrent_writers_in_one_loop(tracker: LocalTracker) -> None:
    [ident] = await tracker.create_issues([NewIssue(title="x")])
    other = LocalTracker(tracker.db_path, "DEMO")
    await asyncio.gather(
        *(tracker.comment(ident, f"a{i}") for i in range(15)),
        *(other.create_issues([NewIssue(title=f"n{i}")]) for i in range(15)),
    )
    issues = await tracker.list_issues()
    assert [i.identifier for i in issues] == [f"DEMO-{n}" for n in range(1, 17)]
    assert len(issues[0].comments) == 15


def test_concurrent_processes_creating_a_fresh_database(db: Path) -> None:
    """Several processes open a database that does not exist yet, at once."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from ralph_dev.core.model import NewIssue\n"
        "from ralph_dev.adapters.tracker.local import LocalTracker\n"
        "t = LocalTracker(Path(sys.argv[1]), 'DEMO')\n"
        "for i in range(10):\n"
        "    t.create_issues_sync([NewIssue(title=f'{sys.argv[2]}-{i}')])\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(db), str(n)], stderr=subprocess.PIPE)
        for n in range(4)
    ]
    errors = [p.communicate(timeout=120)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errors
    assert not any("locked" in e for e in errors)
    issues = LocalTracker(db, "DEMO").list_issues_sync()
    assert sorted(int(i.identifier.split("-")[1]) for i in issues) == list(range(1, 41))
    assert len({i.title for i in issues}) == 40


def test_open_tracker(xdg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = ProjectSettings(name="demo", repo=xdg)
    tracker = open_tracker(local)
    assert isinstance(tracker, LocalTracker)
    assert tracker.key == "DEMO" and tracker.db_path == local.paths.tracker_db
    assert str(tracker.db_path).startswith(str(xdg / "data"))
    # the Linear backend cannot be imported
    monkeypatch.setitem(sys.modules, "ralph_dev.adapters.tracker.linear.tracker", None)
    linear = ProjectSettings(
        name="demo", repo=xdg, tracker=TrackerSettings(kind="linear", linear_project="p")
    )
    with pytest.raises(ConfigError, match="Linear backend is not installed"):
        open_tracker(linear)


@given(st.dictionaries(st.sampled_from("abcdefg"), st.sets(st.sampled_from("abcdefg")), max_size=7))
def test_find_cycle_property(edges: dict[str, set[str]]) -> None:
    """A reported cycle is made of real edges; none reported means a topological order exists."""
    import graphlib

    cycle = find_cycle(edges)
    try:
        tuple(graphlib.TopologicalSorter(edges).static_order())
        acyclic = True
    except graphlib.CycleError:
        acyclic = False
    assert (cycle is None) == acyclic
    if cycle is not None:
        assert cycle[0] == cycle[-1]
        assert len(set(cycle[:-1])) == len(cycle) - 1
        for here, there in itertools.pairwise(cycle):
            assert there in edges.get(here, set())


_batch = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d", None]),  # ref
        st.lists(st.sampled_from(["a", "b", "c", "d", "DEMO-1", "DEMO-2", "DEMO-9"]), max_size=3),
        st.sampled_from([None, "a", "b", "DEMO-1", "DEMO-9"]),  # parent
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=100)  # each example is a fresh SQLite file
@given(batch=_batch)
def test_batches_are_all_or_nothing(tmp_path_factory: pytest.TempPathFactory, batch: list) -> None:
    db = tmp_path_factory.mktemp("prop") / "t.db"
    tracker = LocalTracker(db, "DEMO")
    tracker.create_issues_sync([NewIssue("one")])
    tracker.create_issues_sync([NewIssue("two", blocked_by=("DEMO-1",))])
    before = dump(db)
    entries = [
        NewIssue(title=f"t{i}", ref=ref, blocked_by=tuple(blockers), parent=parent)
        for i, (ref, blockers, parent) in enumerate(batch)
    ]
    try:
        created = tracker.create_issues_sync(entries)
    except TrackerInputError:
        assert dump(db) == before
        return
    assert created == [f"DEMO-{n}" for n in range(3, 3 + len(entries))]
    issues = {i.identifier: i for i in tracker.list_issues_sync()}
    ref_ids = {e.ref: c for e, c in zip(entries, created, strict=True) if e.ref}
    for entry, ident in zip(entries, created, strict=True):
        want = {ref_ids.get(b, b) for b in entry.blocked_by}
        assert set(issues[ident].blocked_by) == want
        assert issues[ident].parent == (ref_ids.get(entry.parent, entry.parent)
                                        if entry.parent else None)
    graph = {i: set(issue.blocked_by) for i, issue in issues.items()}
    assert find_cycle(graph) is None


async def test_a_sub_issue_cannot_be_blocked_by_its_own_parent(tracker: LocalTracker) -> None:
    (parent,) = await tracker.create_issues([NewIssue("phase")])
    (sub,) = await tracker.create_issues([NewIssue("sub", parent=parent)])
    with pytest.raises(TrackerInputError, match=f"dependency cycle {parent} → {sub} → {parent}"):
        await tracker.add_blocker(sub, parent)


async def test_a_listing_is_read_again_only_when_the_database_changed(
        tracker: LocalTracker, db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick lists every issue; what another process (a person's `issue` command)
    committed is in the next listing, and nothing else makes one read the database."""
    (first,) = await tracker.create_issues([NewIssue(title="one")])
    reads = []
    load = tracker.reader.load
    monkeypatch.setattr(tracker.reader, "load", lambda conn, numbers: (
        reads.append(numbers), load(conn, numbers))[1])
    assert [i.title for i in await tracker.list_issues()] == ["one"]
    assert [i.title for i in await tracker.list_issues()] == ["one"]
    assert reads == [None]
    person = LocalTracker(db, "DEMO")  # another writer, as another process would be
    await person.set_state(first, name="Done")
    await person.create_issues([NewIssue(title="two")])
    listed = await tracker.list_issues()
    assert [(i.title, i.state_type) for i in listed] == [
        ("one", StateType.COMPLETED), ("two", StateType.UNSTARTED)]
    assert len(reads) == 2
    await person.close()
    db.rename(db.with_name("aside.db"))  # a person moves the file aside: a fresh tracker
    for suffix in ("-wal", "-shm"):
        db.with_name(db.name + suffix).unlink(missing_ok=True)
    assert await tracker.list_issues() == []
    await tracker.close()
