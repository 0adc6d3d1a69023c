"""``ralph-dev issue …`` end to end: a real config from ``init``, a real SQLite tracker.

Every refusal is checked three ways: non-zero exit, a message naming the
problem, and a byte-for-byte unchanged database.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import make_jj_repo

from ralph_dev.cli import main
from ralph_dev.core.paths import ProjectPaths

RALPH = str(Path(sys.executable).with_name("ralph-dev"))


def dump(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def ok(*args: str) -> str:
    result = cli(*args)
    assert result.exit_code == 0, result.output
    return result.stdout


def refused(*args: str, match: str) -> str:
    result = cli(*args)
    assert result.exit_code != 0, result.output
    assert match in result.stderr, result.stderr
    assert "Traceback" not in result.output
    return result.stderr


@pytest.fixture
def project(xdg: Path) -> Path:
    """Projects demo (key DEMO) and other (key OTHER); returns demo's tracker db."""
    for name in ("demo", "other"):
        make_jj_repo(xdg / name)
        ok("init", name, "--repo", str(xdg / name))
    return ProjectPaths("demo").tracker_db


def test_add_list_show(project: Path) -> None:
    assert ok("issue", "add", "demo", "Schema", "--label", "backend", "--priority", "2",
              "-d", "Tables\nand indexes") == "DEMO-1\n"
    assert ok("issue", "add", "demo", "API", "--blocked-by", "DEMO-1",
              "--label", "a", "--label", "b") == "DEMO-2\n"
    assert ok("issue", "add", "demo", "Docs", "--parent", "DEMO-1") == "DEMO-3\n"
    assert project.is_file()
    table = ok("issue", "list", "demo")
    lines = table.splitlines()
    assert lines[0].split() == ["ID", "STATE", "P", "LABELS", "BLOCKED", "BY", "TITLE"]
    assert lines[1].split() == ["DEMO-1", "Todo", "2", "backend", "-", "Schema"]
    assert lines[2].split() == ["DEMO-2", "Todo", "0", "a,b", "DEMO-1", "API"]
    data = json.loads(ok("issue", "list", "demo", "--json"))
    assert [d["identifier"] for d in data] == ["DEMO-1", "DEMO-2", "DEMO-3"]
    assert data[0]["children"] == ["DEMO-3"] and data[2]["parent"] == "DEMO-1"
    assert data[1]["blocked_by"] == ["DEMO-1"] and data[1]["labels"] == ["a", "b"]
    assert data[0]["description"] == "Tables\nand indexes"
    assert data[0]["state_type"] == "unstarted"
    shown = ok("issue", "show", "DEMO-2")
    assert "DEMO-2  API" in shown and "blocked by: DEMO-1" in shown
    assert "parent:     DEMO-1" in ok("issue", "show", "DEMO-3")
    one = json.loads(ok("issue", "show", "DEMO-1", "--json"))
    assert one["title"] == "Schema" and one["priority"] == 2
    # a sub-issue blocked by its own parent would wait forever: refused by name
    refused("issue", "add", "demo", "Loop", "--parent", "DEMO-1", "--blocked-by", "DEMO-1",
            match="dependency cycle DEMO-1 → 'Loop' → DEMO-1")


def test_empty_list(project: Path) -> None:
    assert "No issues in demo yet" in ok("issue", "list", "demo")
    assert json.loads(ok("issue", "list", "demo", "--json")) == []


def test_state_label_comment(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USER", "carol")
    ok("issue", "add", "demo", "x", "--label", "old")
    assert ok("issue", "state", "DEMO-1", "in progress") == "DEMO-1: In Progress\n"
    assert ok("issue", "label", "DEMO-1", "+user-feedback-given", "+ralph:plan", "-old") == (
        "DEMO-1: ralph:plan, user-feedback-given\n"
    )
    assert ok("issue", "label", "DEMO-1", "+h", "+v") == (
        "DEMO-1: h, ralph:plan, user-feedback-given, v\n"
    )
    assert ok("issue", "label", "DEMO-1", "-h", "-v") == (
        "DEMO-1: ralph:plan, user-feedback-given\n"
    )
    ok("issue", "comment", "DEMO-1", "please use postgres")
    ok("issue", "comment", "DEMO-1", "signed", "--author", "dave")
    data = json.loads(ok("issue", "show", "DEMO-1", "--json"))
    assert data["state"] == "In Progress" and data["state_type"] == "started"
    assert [(c["author"], c["body"], c["by_ralph"]) for c in data["comments"]] == [
        ("carol", "please use postgres", False),
        ("dave", "signed", False),
    ]
    shown = ok("issue", "show", "DEMO-1")
    assert "--- carol" in shown and "please use postgres" in shown


def test_import_plan(project: Path, xdg: Path) -> None:
    ok("issue", "add", "demo", "existing")
    plan = xdg / "plan.toml"
    plan.write_text(
        '[[phase]]\nref = "p1"\ntitle = "Phase one"\n'
        '  [[phase.task]]\n  ref = "a"\n  title = "Task A"\n'
        '  [[phase.task]]\n  title = "Task B"\n  blocked_by = ["a", "DEMO-1"]\n'
    )
    out = ok("issue", "import", "demo", str(plan))
    assert [line.split()[:2] for line in out.splitlines()] == [
        ["DEMO-2", "p1"],
        ["DEMO-3", "a"],
        ["DEMO-4", "-"],
    ]
    data = {d["identifier"]: d for d in json.loads(ok("issue", "list", "demo", "--json"))}
    assert data["DEMO-2"]["children"] == ["DEMO-3", "DEMO-4"]
    assert data["DEMO-4"]["blocked_by"] == ["DEMO-1", "DEMO-3"]


@pytest.mark.parametrize(
    "bad", ["../x", "A-1; rm -rf /", "", "DEMO-1" + "9" * 10_000, "$(reboot)", "DEMO-1\n"]
)
def test_bad_identifiers(project: Path, bad: str) -> None:
    ok("issue", "add", "demo", "x")
    before = dump(project)
    for args in (
        ("issue", "show", bad),
        ("issue", "state", bad, "Done"),
        ("issue", "comment", bad, "hi"),
        ("issue", "label", bad, "+a"),
        ("issue", "block", "DEMO-1", bad),
        ("issue", "add", "demo", "y", "--blocked-by", bad),
        ("issue", "add", "demo", "y", "--parent", bad),
    ):
        err = refused(*args, match="is not an issue identifier")
        assert len(err) < 400
    assert dump(project) == before


def test_unknown_project_and_key(project: Path) -> None:
    refused("issue", "add", "nope", "x", match="unknown project 'nope'")
    refused("issue", "list", "nope", match="ralph-dev init nope")
    refused("issue", "show", "ZZZ-1", match="no configured project uses the issue key 'ZZZ'")
    refused("issue", "add", "../etc", "x", match="not a valid project name")
    assert not project.exists()


def test_unknown_issue_and_state(project: Path) -> None:
    ok("issue", "add", "demo", "x")
    before = dump(project)
    refused("issue", "show", "DEMO-9", match="no issue DEMO-9")
    refused("issue", "state", "DEMO-1", "Shipped", match="unknown state 'Shipped'")
    refused("issue", "comment", "DEMO-1", "  ", match="needs some text")
    refused("issue", "add", "demo", "y", "--state", "Nope", match="unknown state")
    assert cli("issue", "add", "demo", "y", "--priority", "7").exit_code != 0
    assert dump(project) == before


def test_bad_label_tokens_write_nothing(project: Path) -> None:
    ok("issue", "add", "demo", "x", "--label", "keep")
    before = dump(project)
    refused("issue", "label", "DEMO-1", "+new", "plain", match="'plain' is not a label change")
    refused("issue", "label", "DEMO-1", "+new", "-", match="'-' is not a label change")
    refused("issue", "label", "DEMO-1", "+a", "-a", match="both added and removed")
    assert dump(project) == before
    assert cli("issue", "label", "DEMO-1").exit_code != 0


def test_blocker_cycle_refused_and_named(project: Path) -> None:
    ok("issue", "add", "demo", "one")
    ok("issue", "add", "demo", "two", "--blocked-by", "DEMO-1")
    ok("issue", "add", "demo", "three", "--blocked-by", "DEMO-2")
    before = dump(project)
    refused("issue", "block", "DEMO-1", "DEMO-3", match="DEMO-1 → DEMO-3 → DEMO-2 → DEMO-1")
    assert dump(project) == before
    assert ok("issue", "block", "DEMO-3", "DEMO-1") == "DEMO-3: blocked by DEMO-1, DEMO-2\n"
    assert ok("issue", "unblock", "DEMO-3", "DEMO-2") == "DEMO-3: blocked by DEMO-1\n"


def test_blocker_in_another_project(project: Path) -> None:
    ok("issue", "add", "other", "theirs")
    ok("issue", "add", "demo", "ours")
    before = dump(project)
    other_db = ProjectPaths("other").tracker_db
    other_before = dump(other_db)
    refused("issue", "add", "demo", "x", "--blocked-by", "OTHER-1", match="another project")
    refused("issue", "add", "demo", "x", "--parent", "OTHER-1", match="another project")
    refused("issue", "block", "DEMO-1", "OTHER-1", match="another project")
    assert dump(project) == before
    assert dump(other_db) == other_before


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("plan.toml", '[[task]]\ntitle = "ok"\n[[task]]\ntitle = "broken\n', "plan.toml:4"),
        ("plan.md", "- fine {#a}\n- fine too (blocked by: a)\n### bad\n", "plan.md:3"),
        ("plan.md", "- a {#a} (blocked by: b)\n- b {#b} (blocked by: a)\n", "a → b → a"),
        ("plan.toml", '[[task]]\ntitle = "x"\nblocked_by = ["OTHER-1"]\n', "another project"),
        ("plan.toml", '[[task]]\ntitle = "x"\nblocked_by = ["DEMO-99"]\n',
         "DEMO-99 does not exist"),
    ],
)
def test_bad_import_creates_nothing(
    project: Path, xdg: Path, name: str, text: str, match: str
) -> None:
    ok("issue", "add", "demo", "existing")
    before = dump(project)
    plan = xdg / name
    plan.write_text(text)
    refused("issue", "import", "demo", str(plan), match=match)
    assert dump(project) == before
    assert ok("issue", "add", "demo", "next") == "DEMO-2\n"


def test_database_that_is_not_sqlite(project: Path) -> None:
    project.parent.mkdir(parents=True)
    project.write_bytes(b"definitely not sqlite\n" * 40)
    err = refused("issue", "list", "demo", match="is not a SQLite database")
    assert str(project) in err and "move it aside" in err
    refused("issue", "add", "demo", "x", match="is not a SQLite database")
    assert project.read_bytes() == b"definitely not sqlite\n" * 40


def test_read_only_database(project: Path) -> None:
    ok("issue", "add", "demo", "x")
    before = dump(project)
    root = os.geteuid() == 0
    if root:
        subprocess.run(["chattr", "+i", str(project)], check=True)
    else:
        project.chmod(0o444)
    try:
        assert "DEMO-1" in ok("issue", "list", "demo")
        refused("issue", "add", "demo", "y", match="is read-only")
        refused("issue", "comment", "DEMO-1", "hi", match="is read-only")
        refused("issue", "label", "DEMO-1", "+a", match="is read-only")
    finally:
        if root:
            subprocess.run(["chattr", "-i", str(project)], check=True)
        else:
            project.chmod(0o644)
    assert dump(project) == before


def test_concurrent_processes(project: Path) -> None:
    """4 real `ralph-dev` processes × 10 calls (adds and comments) at once."""
    assert not project.exists()
    env = dict(os.environ)
    failures: list[str] = []

    def worker(n: int) -> None:
        for i in range(10):
            if i % 2 == 0 or n == 0:
                args = ["issue", "add", "demo", f"w{n}-{i}"]
            else:
                args = ["issue", "comment", "DEMO-1", f"w{n}-{i}"]
            done = subprocess.run([RALPH, *args], env=env, capture_output=True, text=True,
                                  timeout=120)
            if done.returncode != 0:
                failures.append(f"{args}: {done.stderr}")

    # Worker 0 adds first so DEMO-1 exists before anyone comments on it.
    first = subprocess.run([RALPH, "issue", "add", "demo", "first"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert first.stdout == "DEMO-1\n", first.stderr
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    data = json.loads(ok("issue", "list", "demo", "--json"))
    # 1 + worker 0: 10 adds + workers 1-3: 5 adds each = 26 issues, dense.
    assert [d["identifier"] for d in data] == [f"DEMO-{n}" for n in range(1, 27)]
    assert len({d["title"] for d in data}) == 26
    assert len(data[0]["comments"]) == 15


def test_terminal_escapes_in_issue_text_are_shown_not_obeyed(project: Path) -> None:
    ok("issue", "add", "demo", "evil \x1b]2;pwned\x07 title", "-d", "line\x1b[2J one\nline two")
    ok("issue", "comment", "DEMO-1", "bell\x07 here")
    for out in (ok("issue", "list", "demo"), ok("issue", "show", "DEMO-1")):
        assert "\x1b" not in out and "\x07" not in out
    shown = ok("issue", "show", "DEMO-1")
    assert "line two" in shown and "bell␇ here" in shown  # visible (core.text.for_terminal)
    assert "evil ␛]2;pwned␇ title" in shown
    # --json keeps the data exactly (JSON escapes it).
    data = json.loads(ok("issue", "show", "DEMO-1", "--json"))
    assert data["title"] == "evil \x1b]2;pwned\x07 title"


def test_labels_with_control_characters_are_refused_and_never_shown_raw(project: Path) -> None:
    evil = "x\x1b]2;pwned\x07"
    refused("issue", "add", "demo", "t", "--label", evil, match="no control characters")
    assert json.loads(ok("issue", "list", "demo", "--json")) == []  # nothing half-made
    ok("issue", "add", "demo", "t", "--label", "backend")
    refused("issue", "label", "DEMO-1", "+" + evil, match="no control characters")
    # a label made elsewhere (Linear's UI, an older version) is shown, never obeyed
    import sqlite3

    with sqlite3.connect(project) as db:
        db.execute("INSERT INTO labels (issue, label) VALUES (1, ?)", ("\x1b[2Jwipe",))
    for out in (ok("issue", "list", "demo"), ok("issue", "show", "DEMO-1"),
                ok("issue", "label", "DEMO-1", "+frontend")):
        assert "\x1b" not in out and "\x07" not in out, out
        assert "␛[2Jwipe" in out


# --- issue 27: unknown and no-op input says so (each exited 0 and said nothing) ----------


def test_removing_an_absent_label_says_it_was_not_there(project: Path) -> None:
    ok("issue", "add", "demo", "t", "--label", "backend")
    before = dump(project)
    out = ok("issue", "label", "DEMO-1", "-absent", "+backend")
    assert "DEMO-1: label 'absent' was not there: nothing removed" in out
    assert "DEMO-1: label 'backend' was already there" in out
    assert dump(project) == before  # and indeed nothing changed
    out = ok("issue", "label", "DEMO-1", "-backend", "+new")
    assert "was not there" not in out and "already" not in out and "DEMO-1: new" in out


def test_events_of_an_unknown_issue_is_an_error(project: Path) -> None:
    ok("issue", "add", "demo", "t")
    err = refused("events", "demo", "--issue", "DEMO-999", match="no issue DEMO-999")
    assert "no event of demo names DEMO-999" in err and "issue list demo" in err
    refused("events", "demo", "--issue", "OTHER-1", match="no event of demo names OTHER-1")
    assert ok("events", "demo", "--issue", "DEMO-1") == ""  # known, nothing happened yet


def test_a_missing_config_file_is_named(project: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent.toml"
    for args in (["status"], ["issue", "list", "demo"], ["events", "demo"]):
        err = refused("--config", str(missing), *args,
                      match=f"the config file {missing} (--config) does not exist")
        assert "no projects configured" not in err
    result = CliRunner().invoke(main, ["status"], env={"RALPH_DEV_CONFIG": str(missing)})
    assert result.exit_code != 0 and f"{missing} (RALPH_DEV_CONFIG) does not exist" in \
        result.stderr
    make_jj_repo(tmp_path / "third")  # init is what makes the file
    ok("--config", str(missing), "init", "third", "--repo", str(tmp_path / "third"))
    assert "third" in ok("--config", str(missing), "status", "--json")


def test_a_setting_variable_with_a_typo_is_refused_naming_the_setting(project: Path) -> None:
    result = CliRunner().invoke(main, ["issue", "list", "demo"],
                                env={"RALPH_DEV_LIMITS_MAX_WORKER": "5"})
    assert result.exit_code != 0
    assert "did you mean RALPH_DEV_LIMITS_MAX_WORKERS?" in result.stderr
