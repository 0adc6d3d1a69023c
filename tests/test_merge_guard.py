"""No merge ever reverts trunk: the merge guard, on a real jj, colocated or not.

The defect it closed: a ``jj rebase`` killed after it moved a colocated
workspace's git HEAD but before it committed its operation made the next jj
command there adopt the old on-disk tree on top of the new HEAD, as a nameless
change that deleted what other issues had merged; ralph-dev named it after the
issue and moved trunk to it. Workspaces are no longer git worktrees (issue 11),
so that path is gone; the guard still stands between a workspace whose files
went back to before its rebase and trunk. A merge killed right before it moved
trunk, then the files trunk brought in deleted on disk, reproduces that state.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from test_executor_contract import World
from test_executor_contract import world as world  # the fixture, shared
from test_jj import make_repo, show, trunk_commit, trunk_files, work

from ralph_dev.adapters.jj import JjRepository
from ralph_dev.adapters.jj_guard import MergeRefused
from ralph_dev.adapters.process import CommandResult
from ralph_dev.core.model import StateType


def merge_killed_before_trunk_moved(jj: JjRepository, name: str) -> None:
    """Run a merge of NAME that dies right before it moves trunk: its work is rebased
    onto trunk (files and all) and its intent is on disk, as a killed controller leaves them."""
    real = jj.cli.run

    def run(*args: str, cwd: Path | None = None, touch_checkout: bool = False) -> CommandResult:
        if args[:3] == ("bookmark", "set", jj.trunk.name):
            raise KeyboardInterrupt("killed before moving trunk")
        return real(*args, cwd=cwd, touch_checkout=touch_checkout)

    jj.cli.run = run  # type: ignore[method-assign]
    try:
        with pytest.raises(KeyboardInterrupt):
            jj.merger.merge(name)
    finally:
        del jj.cli.run
    assert jj.home.intents.load(name)


@pytest.fixture(params=["colocated", "plain"])
def jj(request: pytest.FixtureRequest, tmp_path: Path, jj_bin: str) -> JjRepository:
    repo = make_repo(jj_bin, tmp_path / "repo", colocate=request.param == "colocated")
    return JjRepository.open(repo, tmp_path / "workspaces", "main", jj_bin=jj_bin)


@pytest.fixture
def colocated(tmp_path: Path, jj_bin: str) -> JjRepository:
    repo = make_repo(jj_bin, tmp_path / "repo", colocate=True)
    return JjRepository.open(repo, tmp_path / "workspaces", "main", jj_bin=jj_bin)


def test_a_workspace_whose_head_moved_under_it_cannot_revert_trunk(colocated: JjRepository) -> None:
    jj = colocated
    work(jj, "ENG-1", {"one.txt": "one\n"})
    second = work(jj, "ENG-2", {"two.txt": "two\n"})
    assert jj.merger.merge("ENG-1").merged
    merged = trunk_commit(jj)
    # the merge died after its rebase, and the workspace's files went back to before it
    merge_killed_before_trunk_moved(jj, "ENG-2")
    (second / "one.txt").unlink()
    with pytest.raises(MergeRefused, match=r"one\.txt") as refused:
        jj.merger.merge("ENG-2")
    assert "Trunk is untouched" in str(refused.value) and "jj abandon" in str(refused.value)
    assert trunk_commit(jj) == merged
    assert show(jj, "main", "one.txt") == "one\n"
    # refused again while nothing changed: the intent recorded before the damage holds
    with pytest.raises(MergeRefused):
        jj.merger.merge("ENG-2")
    assert trunk_commit(jj) == merged
    # following the refusal's advice (restore the file the stray change deleted) lets
    # the issue's own work through, and only it
    (second / "one.txt").write_text("one\n")
    result = jj.merger.merge("ENG-2")
    assert result.merged, result.detail
    assert trunk_files(jj) >= {"one.txt", "two.txt", "README"}
    assert not jj.home.intents.load("ENG-2")


def test_an_ordinary_merge_records_and_clears_its_intent(jj: JjRepository) -> None:
    work(jj, "ENG-1", {"one.txt": "one\n"})
    assert jj.merger.merge("ENG-1").merged
    assert jj.home.intents.load("ENG-1") is None
    assert not list((jj.home.root / ".ralph-merge").glob("*.json"))


# --- the controller holds a refused merge for a person ----------------------------------


def test_a_refused_merge_is_held_with_its_evidence_and_trunk_stays(world: World) -> None:
    project = world.project
    jj = project.jj
    first, second, third = project.issue("first"), project.issue("second"), project.issue("third")
    work(jj, first, {"one.txt": "one\n"})
    work(jj, second, {"two.txt": "two\n"})
    third_ws = work(jj, third, {"three.txt": "three\n"})  # from trunk before the merges
    for ident in (first, second):
        project.tracker.set_state_sync(ident, type=StateType.COMPLETED)
        project.store.update_record(ident, done=True)
    asyncio.run(world.ctl.tick())  # first merges (identifier order), second too
    assert {"one.txt", "two.txt"} <= trunk_files(jj)

    # a merge of third died after its rebase, and its files went back to before it
    merge_killed_before_trunk_moved(jj, third)
    for merged in ("one.txt", "two.txt"):
        (third_ws / merged).unlink()
    project.tracker.set_state_sync(third, type=StateType.COMPLETED)
    project.store.update_record(third, done=True)
    before = trunk_commit(jj)
    asyncio.run(world.ctl.tick())
    assert trunk_commit(jj) == before
    record = project.store.load_record(third)
    assert record is not None and record.hold_reason  # a person is needed: said next tick
    asyncio.run(world.ctl.tick())
    issue = project.tracker.get_sync(third)
    assert "user-input-needed" in issue.labels
    assert "one.txt" in issue.comments[-1].body and "jj abandon" in issue.comments[-1].body
    # held: the next ticks leave it alone (no merge retried every tick)
    plan = asyncio.run(world.ctl.tick()).plan
    assert not [a for a in plan.actions if a.issue == third]
    # a person restores the files and answers: the issue's own work merges, only it
    for path, text in (("one.txt", "one\n"), ("two.txt", "two\n")):
        (third_ws / path).write_text(text)
    project.tracker.change_labels_sync(third, add=["user-feedback-given"])
    for _ in range(3):
        asyncio.run(world.ctl.tick())
    assert {"one.txt", "two.txt", "three.txt"} <= trunk_files(jj)
    assert third not in {w.name for w in jj.workspaces.list_workspaces()}
