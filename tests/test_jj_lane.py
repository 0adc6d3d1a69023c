"""The merge lane's jj steps (issue 34), on a real jj: a batch checked out together in
ralph-dev's own workspace, and landed at once, each change keeping its own commit; a
land killed part-way finished by the next; trunk moved or a change swapped: nothing
lands."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_jj import make_repo, show, trunk_commit, trunk_files, work

from ralph_dev.adapters.jj import JjRepository


@pytest.fixture(params=["colocated", "plain"])
def jj(request: pytest.FixtureRequest, tmp_path: Path, jj_bin: str) -> JjRepository:
    repo = make_repo(jj_bin, tmp_path / "repo", colocate=request.param == "colocated")
    return JjRepository.open(repo, tmp_path / "workspaces", "main", jj_bin=jj_bin)


def prepared(jj: JjRepository, *names: str) -> list[tuple[str, str]]:
    out = []
    for name in names:
        head = jj.merger.prepare_merge(name)
        assert isinstance(head, str), head
        out.append((name, head))
    return out


def three(jj: JjRepository) -> list[tuple[str, str]]:
    for i, name in enumerate(("ENG-1", "ENG-2", "ENG-3"), start=1):
        work(jj, name, {f"file{i}.txt": f"content {i}\n"})
    return prepared(jj, "ENG-1", "ENG-2", "ENG-3")


def descriptions(jj: JjRepository, limit: int) -> list[str]:
    return jj.cli.run("--ignore-working-copy", "log", "--no-graph", "-r", "::main ~ root()",
                      "--limit", str(limit), "-T", 'description.first_line() ++ "\\n"'
                      ).check().lines()


def test_a_batch_is_checked_out_together_and_lands_at_once_each_its_own_commit(
        jj: JjRepository) -> None:
    batch = three(jj)
    base = trunk_commit(jj)
    checkout, verified = jj.trunk.lane_checkout([head for _, head in batch])
    assert {"file1.txt", "file2.txt", "file3.txt"} <= {p.name for p in checkout.iterdir()}
    assert checkout.name == ".ralph-lane"
    (checkout / "build.out").write_text("what a verify left\n")  # never lands
    jj.trunk.release_lane()
    result = jj.merger.land(batch, base, verified)
    assert result.merged and result.commit == trunk_commit(jj)
    assert {"file1.txt", "file2.txt", "file3.txt"} <= trunk_files(jj)
    assert "build.out" not in trunk_files(jj)
    assert descriptions(jj, 3) == ["ENG-3: work", "ENG-2: work", "ENG-1: work"]
    for name, _ in batch:
        assert jj.home.intents.load(name) is None
    assert jj.merger.land(batch, base, verified).merged  # landed already: a success


def test_a_land_killed_part_way_is_finished_by_the_next(jj: JjRepository) -> None:
    batch = three(jj)
    base = trunk_commit(jj)
    _, verified = jj.trunk.lane_checkout([head for _, head in batch])
    jj.trunk.release_lane()
    # killed after stacking ENG-2 on ENG-1 (ENG-3 not yet, trunk not moved)
    path = jj.workspaces.workspace_path("ENG-2")
    jj.cli.run("rebase", "-s", f"roots({base}..{batch[1][1]})", "-o", batch[0][1],
               cwd=path).check()
    assert trunk_commit(jj) == base
    result = jj.merger.land(batch, base, verified)
    assert result.merged
    assert descriptions(jj, 3) == ["ENG-3: work", "ENG-2: work", "ENG-1: work"]


def test_nothing_lands_when_trunk_moved_or_a_change_is_not_the_verified_one(
        jj: JjRepository) -> None:
    batch = three(jj)
    base = trunk_commit(jj)
    swapped = jj.workspaces.workspace_path("ENG-2")
    (swapped / "file2.txt").write_text("changed after the verify\n")
    jj.workspaces.snapshot("ENG-2")
    jj.cli.run("squash", cwd=swapped).check()  # the verified head itself is rewritten
    stale = jj.merger.land(batch, base)
    assert not stale.merged and stale.stale and trunk_commit(jj) == base
    work(jj, "ENG-4", {"four.txt": "4\n"})
    assert jj.merger.merge("ENG-4").merged  # trunk moves meanwhile
    moved = jj.merger.land(batch, base)
    assert not moved.merged and moved.moved
    assert "file1.txt" not in trunk_files(jj) and show(jj, "main", "four.txt") == "4\n"
