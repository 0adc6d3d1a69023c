"""Plan files: both formats, their errors (file:line: problem), and import into a real tracker."""

from __future__ import annotations

from pathlib import Path

import pytest

from ralph_dev.adapters.tracker.local import LocalTracker
from ralph_dev.core.model import NewIssue
from ralph_dev.core.planfile import PlanError, parse_plan

TOML_PLAN = '''
[[phase]]
ref = "p1"
title = "Phase 1: storage"
description = """
Everything about storing things.
"""

  [[phase.task]]
  ref = "schema"
  title = "Design the schema"
  priority = 2
  labels = ["backend"]
  description = "Tables, indexes."

  [[phase.task]]
  ref = "api"
  title = "API"
  blocked_by = ["schema"]

[[phase]]
title = "Phase 2: no ref"
blocked_by = ["p1"]

  [[phase.task]]
  title = "Polish"

[[task]]
title = "README"
blocked_by = ["api", "DEMO-3"]
'''

MD_PLAN = """\
# The plan

Some preamble text that is ignored.

- Top-level task {#top} (priority: 3)
  Its description,
  over two lines.

  - a nested bullet stays description

## Phase 1: storage {#p1} (labels: ralph:phase)
The phase's description.

- Design the schema {#schema} (labels: backend, db) (priority: 2)
    indented more: still description
- [ ] API (call it v2) {#api} (blocked by: schema, DEMO-3)
* Docs (blocked by: api)

## Phase 2
- Release (blocked-by: p1, top)
      ```
      code block
      ```
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_toml_plan(tmp_path: Path) -> None:
    entries = parse_plan(write(tmp_path, "plan.toml", TOML_PLAN))
    assert [e.title for e in entries] == [
        "Phase 1: storage",
        "Design the schema",
        "API",
        "Phase 2: no ref",
        "Polish",
        "README",
    ]
    phase1, schema, api, phase2, polish, readme = entries
    assert phase1 == NewIssue(
        title="Phase 1: storage", description="Everything about storing things.", ref="p1"
    )
    assert schema.parent == "p1" and schema.priority == 2 and schema.labels == ("backend",)
    assert schema.description == "Tables, indexes."
    assert api.blocked_by == ("schema",) and api.parent == "p1"
    assert phase2.ref == "phase-1" and polish.parent == "phase-1"
    assert phase2.blocked_by == ("p1",)
    assert readme.parent is None and readme.blocked_by == ("api", "DEMO-3")


def test_markdown_plan(tmp_path: Path) -> None:
    entries = parse_plan(write(tmp_path, "plan.md", MD_PLAN))
    by_title = {e.title: e for e in entries}
    assert list(by_title) == [
        "Top-level task",
        "Phase 1: storage",
        "Design the schema",
        "API (call it v2)",
        "Docs",
        "Phase 2",
        "Release",
    ]
    top = by_title["Top-level task"]
    assert top.ref == "top" and top.priority == 3 and top.parent is None
    assert top.description == (
        "Its description,\nover two lines.\n\n- a nested bullet stays description"
    )
    phase = by_title["Phase 1: storage"]
    assert phase.ref == "p1" and phase.labels == ("ralph:phase",)
    assert phase.description == "The phase's description."
    schema = by_title["Design the schema"]
    assert schema.labels == ("backend", "db") and schema.priority == 2
    assert schema.parent == "p1" and schema.description == "indented more: still description"
    api = by_title["API (call it v2)"]
    assert api.ref == "api" and api.blocked_by == ("schema", "DEMO-3")
    assert by_title["Docs"].blocked_by == ("api",) and by_title["Docs"].ref is None
    assert by_title["Phase 2"].ref == "phase-1"
    release = by_title["Release"]
    assert release.parent == "phase-1" and release.blocked_by == ("p1", "top")
    assert release.description == "```\ncode block\n```"


def test_parent_default_for_top_level_entries(tmp_path: Path) -> None:
    entries = parse_plan(write(tmp_path, "plan.toml", TOML_PLAN), parent="DEMO-7")
    assert [e.parent for e in entries] == ["DEMO-7", "p1", "p1", "DEMO-7", "phase-1", "DEMO-7"]
    with pytest.raises(PlanError, match="not an issue identifier"):
        parse_plan(write(tmp_path, "plan.toml", TOML_PLAN), parent="../x")


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("p.toml", '[[task]]\ntitle = "a"\n\n[[task]]\ntitle = "b\n', ":5: TOML syntax error"),
        ("p.toml", '[[task]]\ntitle = "a"\n\n[[task]]\ntitel = "b"\n', ":4: task 2: unknown key"),
        ("p.toml", '[[phase]]\ntitle = "p"\n  [[phase.task]]\n  ref = "x"\n',
         ":3: phase 1, task 1"),
        ("p.toml", '[[task]]\ntitle = "a"\npriority = 7\n', ":1: task 1 ('a'): priority 7"),
        ("p.toml", '[[task]]\ntitle = "a"\nlabels = "x"\n', "labels must be a list"),
        ("p.toml", 'tasks = []\n', "unknown top-level key 'tasks'"),
        ("p.toml", '[[task]]\ntitle = "a"\nref = "x"\n[[task]]\ntitle = "b"\nref = "x"\n',
         ":4: task 2 ('b'): ref 'x' is already used by task 1 ('a') (line 1)"),
        ("p.toml", '[[task]]\ntitle = "a"\nblocked_by = ["ghost"]\n',
         "blocked by 'ghost', which is neither a ref in this file nor an issue identifier"),
        ("p.toml", '[[task]]\ntitle = "a"\nref = "a"\nblocked_by = ["a"]\n', "cannot block itself"),
        ("p.toml", '[[task]]\ntitle = "a"\nref = "DEMO-1"\n', "looks like an issue identifier"),
        ("p.toml", '[[task]]\ntitle = "a"\nref = "a b"\n', "may use only letters"),
        ("p.toml", "", "has no phases or tasks"),
        ("p.md", "## Phase\n- a\n### Detail\n", ":3: ### heading: only '## ' headings"),
        ("p.md", "## Phase\n- a\nloose text\n", ":3: unindented text 'loose text' after a task"),
        ("p.md", "- a (priority: high)\n", ":1: task: priority 'high' is not 0-4"),
        ("p.md", "- {#a}\n", ":1: task: the title is empty"),
        ("p.md", "- a {#}\n", "empty {#} attribute"),
        ("p.md", "- a (blocked by: )\n", "lists nothing"),
        ("p.md", "- a {#x}\n- b {#x}\n", ":2: task 'b': ref 'x' is already used"),
        ("p.md", "- a (blocked by: nope)\n", ":1: task 'a': blocked by 'nope'"),
        ("p.md", "- a\n  ```\n  never closed\n", "code block is never closed"),
        ("p.md", "# Only a title\n\nsome text\n", "has no phases or tasks"),
        ("p.txt", "- a\n", "unknown plan format '.txt'"),
    ],
)
def test_errors_name_file_line_and_problem(
    tmp_path: Path, name: str, text: str, expected: str
) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(PlanError) as err:
        parse_plan(path)
    assert str(err.value).startswith(str(path))
    assert expected in str(err.value)


def test_unreadable_inputs(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="cannot be read"):
        parse_plan(tmp_path / "missing.toml")
    bad = tmp_path / "latin1.md"
    bad.write_bytes(b"- caf\xe9\n")
    with pytest.raises(PlanError, match="not UTF-8"):
        parse_plan(bad)


async def test_import_into_tracker(tmp_path: Path) -> None:
    tracker = LocalTracker(tmp_path / "t.db", "DEMO")
    await tracker.create_issues([NewIssue(title=f"old {i}") for i in range(3)])
    created = await tracker.create_issues(parse_plan(write(tmp_path, "plan.md", MD_PLAN)))
    assert created == [f"DEMO-{n}" for n in range(4, 11)]
    issues = {i.title: i for i in await tracker.list_issues()}
    assert issues["Phase 1: storage"].children == ("DEMO-6", "DEMO-7", "DEMO-8")
    assert issues["API (call it v2)"].blocked_by == ("DEMO-3", "DEMO-6")
    assert issues["Release"].blocked_by == ("DEMO-4", "DEMO-5")
    assert issues["Release"].parent == "DEMO-9"


def test_toml_line_numbers_are_dropped_rather_than_wrong(tmp_path: Path) -> None:
    text = 'note = """\n[[task]]\n"""\n[[task]]\ntitle = "a"\npriority = 9\n'
    with pytest.raises(PlanError) as err:
        parse_plan(write(tmp_path, "p.toml", text))
    assert "unknown top-level key 'note'" in str(err.value)
    text = '[[task]]\ntitle = "a"\ndescription = """\n[[task]]\n"""\n[[task]]\ntitle = ""\n'
    with pytest.raises(PlanError) as err:
        parse_plan(write(tmp_path, "p.toml", text))
    assert str(err.value) == f"{tmp_path / 'p.toml'}: task 2: needs a title = \"…\""
