"""The jj adapter against the real jj binary in temporary repositories."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from ralph_dev.adapters.jj import JjRepository
from ralph_dev.adapters.jj_cli import JJError, child_path
from ralph_dev.adapters.jj_home import InvalidWorkspaceName

ENV = {"JJ_USER": "test", "JJ_EMAIL": "test@localhost"}


def _jj(jj_bin: str, cwd: Path, *args: str) -> str:
    env = {**os.environ, **ENV, "PATH": child_path(jj_bin)}
    proc = subprocess.run(
        [jj_bin, "--no-pager", "--color", "never", *args],
        cwd=cwd, env=env, capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def make_repo(jj_bin: str, path: Path, *, colocate: bool = True) -> Path:
    path.mkdir(parents=True)
    _jj(jj_bin, path, "git", "init", "--colocate" if colocate else "--no-colocate")
    (path / "README").write_text("hello\n")
    (path / "shared.txt").write_text("line 1\nline 2\nline 3\n")
    _jj(jj_bin, path, "commit", "-m", "first")
    _jj(jj_bin, path, "bookmark", "create", "main", "-r", "@-")
    return path


@pytest.fixture
def repo(tmp_path: Path, jj_bin: str) -> Path:
    return make_repo(jj_bin, tmp_path / "repo")


@pytest.fixture
def jj(repo: Path, tmp_path: Path, jj_bin: str) -> JjRepository:
    return JjRepository.open(repo, tmp_path / "workspaces", "main", jj_bin=jj_bin)


def show(jj: JjRepository, rev: str, path: str) -> str:
    return jj.cli.run("--ignore-working-copy", "file", "show", "-r", rev, path).check().stdout


def trunk_files(jj: JjRepository) -> set[str]:
    out = jj.cli.run("--ignore-working-copy", "file", "list", "-r", "main").check()
    return set(out.lines())


def trunk_commit(jj: JjRepository) -> str:
    return jj.cli.run(
        "--ignore-working-copy", "log", "--no-graph", "-r", "main", "-T", "commit_id"
    ).check().stdout


def workspaces(jj: JjRepository) -> dict[str, object]:
    return {w.name: w for w in jj.workspaces.list_workspaces()}


# --- PATH and the subprocess site ---------------------------------------------


def test_child_path_puts_the_git_next_to_the_real_jj_first(tmp_path: Path) -> None:
    real = tmp_path / "private" / "bin"
    real.mkdir(parents=True)
    for tool in ("jj", "git"):
        (real / tool).write_text("#!/bin/sh\n")
        (real / tool).chmod(0o755)
    links = tmp_path / "local-bin"
    links.mkdir()
    (links / "jj").symlink_to(real / "jj")
    path = child_path(str(links / "jj"), base="/usr/bin:/bin")
    assert path.split(os.pathsep) == [str(real), "/usr/bin", "/bin"]
    # no git beside jj: PATH unchanged
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "jj").write_text("#!/bin/sh\n")
    (lone / "jj").chmod(0o755)
    assert child_path(str(lone / "jj"), base="/usr/bin:/bin") == "/usr/bin:/bin"


def test_every_jj_process_gets_child_path(tmp_path: Path, jj_bin: str) -> None:
    """A recording jj wrapper (with a git beside it) sees its own dir first on PATH."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    record = tmp_path / "paths.txt"
    real_git = Path(child_path(jj_bin).split(os.pathsep)[0]) / "git"
    assert real_git.exists(), "the installed jj has a git beside it on this machine"
    (fake / "jj").write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$PATH" >> {record}\nexec {jj_bin} "$@"\n'
    )
    (fake / "git").write_text(f'#!/bin/sh\nexec {real_git} "$@"\n')
    for tool in ("jj", "git"):
        (fake / tool).chmod(stat.S_IRWXU)
    repo = make_repo(jj_bin, tmp_path / "repo")
    jj = JjRepository.open(repo, tmp_path / "ws", jj_bin=str(fake / "jj"))
    jj.trunk.check_repo()
    jj.workspaces.add_workspace("ENG-1")
    (tmp_path / "ws" / "ENG-1" / "f.txt").write_text("x\n")
    jj.workspaces.describe("ENG-1", "ENG-1: f")
    assert jj.merger.merge("ENG-1").merged
    seen = record.read_text().splitlines()
    assert len(seen) == jj.cli.calls > 5
    assert all(p.split(os.pathsep)[0] == str(fake) for p in seen)
    # the system git (2.39 here) may not read the repo after `workspace add`,
    # the git on child_path must
    proc = subprocess.run(
        ["git", "status", "--short"], cwd=repo, capture_output=True, text=True, check=False,
        env={**os.environ, "PATH": jj.cli.child_path()},
    )
    assert proc.returncode == 0, proc.stderr


def test_run_reports_failures_with_the_command(jj: JjRepository) -> None:
    result = jj.cli.run("log", "-r", "no-such-revision")
    assert not result.ok and result.returncode != 0
    with pytest.raises(JJError) as err:
        result.check()
    assert err.value.command[-1] == "no-such-revision"
    assert "no-such-revision" in err.value.stderr
    assert err.value.returncode == result.returncode


def test_missing_jj_binary_is_a_result_not_a_crash(repo: Path, tmp_path: Path) -> None:
    jj = JjRepository.open(repo, tmp_path / "ws", jj_bin=str(tmp_path / "nope" / "jj"))
    result = jj.cli.run("root")
    assert result.returncode == 127
    with pytest.raises(JJError):
        result.check()


# --- check_repo ----------------------------------------------------------------


def test_check_repo_accepts_colocated_and_plain_jj_repos(
    jj: JjRepository, tmp_path: Path, jj_bin: str
) -> None:
    jj.trunk.check_repo()
    plain = make_repo(jj_bin, tmp_path / "plain", colocate=False)
    assert not (plain / ".git").exists()
    JjRepository.open(plain, tmp_path / "ws2", jj_bin=jj_bin).trunk.check_repo()


def test_check_repo_says_how_to_fix(tmp_path: Path, jj_bin: str) -> None:
    missing = JjRepository.open(tmp_path / "missing", tmp_path / "ws", jj_bin=jj_bin)
    with pytest.raises(JJError, match="does not exist"):
        missing.trunk.check_repo()

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(JJError, match=r"not a jj repository.*jj git init"):
        JjRepository.open(empty, tmp_path / "ws", jj_bin=jj_bin).trunk.check_repo()

    gitonly = tmp_path / "gitonly"
    gitonly.mkdir()
    subprocess.run(["git", "init", "-q", str(gitonly)], check=True)
    with pytest.raises(JJError, match=r"jj git init --colocate"):
        JjRepository.open(gitonly, tmp_path / "ws", jj_bin=jj_bin).trunk.check_repo()

    nobookmark = tmp_path / "nobookmark"
    nobookmark.mkdir()
    _jj(jj_bin, nobookmark, "git", "init")
    with pytest.raises(JJError, match=r"jj bookmark create main -r @-"):
        JjRepository.open(nobookmark, tmp_path / "ws", jj_bin=jj_bin).trunk.check_repo()

    repo = make_repo(jj_bin, tmp_path / "repo")
    with pytest.raises(JJError, match="trunk bookmark 'trunk'"):
        JjRepository.open(repo, tmp_path / "ws", "trunk", jj_bin=jj_bin).trunk.check_repo()


def test_from_settings(tmp_path: Path, repo: Path) -> None:
    from ralph_dev.core.config import ProjectSettings

    settings = ProjectSettings(name="demo", repo=repo, trunk="main",
                               workspace_root=tmp_path / "w")
    jj = JjRepository.from_settings(settings)
    assert (jj.cli.repo, jj.home.root, jj.trunk.name) == (repo, tmp_path / "w", "main")


# --- workspaces -----------------------------------------------------------------


def test_add_workspace_is_inside_the_root_and_idempotent(jj: JjRepository, tmp_path: Path) -> None:
    path = jj.workspaces.add_workspace("ENG-1")
    assert path == (tmp_path / "workspaces" / "ENG-1").resolve()
    assert (path / "README").read_text() == "hello\n"
    (path / "wip.txt").write_text("work in progress\n")
    assert jj.workspaces.add_workspace("ENG-1") == path
    assert (path / "wip.txt").read_text() == "work in progress\n"
    listed = jj.workspaces.list_workspaces()
    assert [w.name for w in listed] == ["ENG-1"]
    assert listed[0].path == str(path)
    # reusing snapshotted nothing away; the change is bookmarked
    bookmarks = jj.cli.run("--ignore-working-copy", "bookmark", "list", "-T", 'name ++ "\\n"')
    assert "ralph/ENG-1" in bookmarks.check().lines()


@pytest.mark.parametrize(
    "name",
    ["../x", "a/b", "..", ".", "", "-rf", "x;rm -rf ~", "$(touch x)", "a b", "C-c\n",
     "x" * 200, "/abs", ".hidden"],
)
def test_hostile_workspace_names_are_refused(jj: JjRepository, tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidWorkspaceName):
        jj.workspaces.workspace_path(name)
    with pytest.raises(InvalidWorkspaceName):
        jj.workspaces.add_workspace(name)
    assert not (tmp_path / "x").exists()
    assert jj.workspaces.list_workspaces() == []


def test_symlink_out_of_the_root_is_refused(jj: JjRepository, tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "ENG-9").symlink_to(outside)
    with pytest.raises(InvalidWorkspaceName, match="outside"):
        jj.workspaces.add_workspace("ENG-9")


def test_foreign_directory_is_not_taken_over(jj: JjRepository, tmp_path: Path) -> None:
    stray = tmp_path / "workspaces" / "ENG-3"
    stray.mkdir(parents=True)
    (stray / "notes.txt").write_text("mine\n")
    with pytest.raises(JJError, match="move it away"):
        jj.workspaces.add_workspace("ENG-3")
    assert (stray / "notes.txt").read_text() == "mine\n"


def test_default_and_foreign_workspaces_are_not_listed(
    jj: JjRepository, repo: Path, tmp_path: Path, jj_bin: str
) -> None:
    jj.workspaces.add_workspace("ENG-1")
    jj.trunk.trunk_checkout()
    _jj(jj_bin, repo, "workspace", "add", "--name", "mine", str(tmp_path / "elsewhere"))
    assert [w.name for w in jj.workspaces.list_workspaces()] == ["ENG-1"]


# --- merge ------------------------------------------------------------------------


def work(jj: JjRepository, name: str, files: dict[str, str], message: str | None = None) -> Path:
    path = jj.workspaces.add_workspace(name)
    for rel, text in files.items():
        (path / rel).write_text(text)
    jj.workspaces.describe(name, message or f"{name}: work")
    return path


def test_merge_three_workspaces_into_trunk(jj: JjRepository) -> None:
    names = ["ENG-1", "ENG-2", "ENG-3"]
    for i, name in enumerate(names, start=1):
        work(jj, name, {f"file{i}.txt": f"content {i}\n"})
    state = workspaces(jj)
    assert all(state[n].has_unmerged_change and not stale(jj, n) for n in names)
    commits = []
    for name in names:
        before = trunk_commit(jj)
        result = jj.merger.merge(name)
        assert result.merged and not result.conflicted, result.detail
        assert result.commit and result.commit != before
        assert trunk_commit(jj) == result.commit
        commits.append(result.commit)
        # no workspace, merged or not, is stale after a merge
        assert not any(stale(jj, w.name) for w in jj.workspaces.list_workspaces())
        assert not workspaces(jj)[name].has_unmerged_change
    log = jj.trunk.trunk_log()
    assert log == ["ENG-3: work", "ENG-2: work", "ENG-1: work", "first"]
    assert {"file1.txt", "file2.txt", "file3.txt", "README"} <= trunk_files(jj)
    for i in (1, 2, 3):
        assert show(jj, "main", f"file{i}.txt") == f"content {i}\n"
    # linear history: each merged change's parent is the previous one
    parents = jj.cli.run(
        "--ignore-working-copy", "log", "--no-graph", "-r", "::main ~ root()",
        "-T", 'parents.len() ++ "\\n"',
    ).check().lines()
    assert set(parents) == {"1"}
    state = workspaces(jj)
    assert not any(w.has_unmerged_change or w.conflicted for w in state.values())
    # edits after the merge start a new change: trunk does not move with them
    (jj.workspaces.workspace_path("ENG-3") / "later.txt").write_text("later\n")
    jj.workspaces.snapshot("ENG-3")
    assert trunk_commit(jj) == commits[-1]
    assert workspaces(jj)["ENG-3"].has_unmerged_change
    # merging again is idempotent: nothing new → nothing to do, then only the new work
    assert jj.merger.merge("ENG-2").merged is False


def test_merge_of_an_empty_workspace_does_nothing(jj: JjRepository) -> None:
    jj.workspaces.add_workspace("ENG-5")
    before = trunk_commit(jj)
    result = jj.merger.merge("ENG-5")
    assert not result.merged and not result.conflicted
    assert "nothing to merge" in result.detail
    assert trunk_commit(jj) == before


def test_merge_names_an_undescribed_change(jj: JjRepository) -> None:
    path = jj.workspaces.add_workspace("ENG-6")
    (path / "x.txt").write_text("x\n")
    assert jj.merger.merge("ENG-6").merged
    assert jj.trunk.trunk_log(1) == ["ENG-6"]


def test_merge_of_several_commits_keeps_them_all(jj: JjRepository, jj_bin: str) -> None:
    path = work(jj, "ENG-7", {"a.txt": "a\n"}, "ENG-7: part a")
    _jj(jj_bin, path, "new")
    (path / "b.txt").write_text("b\n")
    jj.workspaces.describe("ENG-7", "ENG-7: part b")
    _jj(jj_bin, path, "new")  # the agent left an empty change on top
    assert jj.merger.merge("ENG-7").merged
    assert jj.trunk.trunk_log(3) == ["ENG-7: part b", "ENG-7: part a", "first"]


def test_conflicting_pair_leaves_trunk_alone(jj: JjRepository) -> None:
    work(jj, "ENG-1", {"shared.txt": "line 1\nONE\nline 3\n"})
    second = work(jj, "ENG-2", {"shared.txt": "line 1\nTWO\nline 3\n"})
    assert jj.merger.merge("ENG-1").merged
    trunk = trunk_commit(jj)
    result = jj.merger.merge("ENG-2")
    assert result.conflicted and not result.merged
    assert "ENG-2" in result.detail and "not moved" in result.detail
    assert trunk_commit(jj) == trunk
    assert show(jj, "main", "shared.txt") == "line 1\nONE\nline 3\n"
    state = workspaces(jj)
    assert state["ENG-2"].conflicted and state["ENG-2"].has_unmerged_change
    assert not stale(jj, "ENG-2")
    # the workspace holds the conflict, both sides visible for a resolve worker
    text = (second / "shared.txt").read_text()
    assert "ONE" in text and "TWO" in text
    # a second attempt still refuses without touching trunk
    assert jj.merger.merge("ENG-2").conflicted
    assert trunk_commit(jj) == trunk
    # forgetting it would lose the conflicted work
    with pytest.raises(JJError, match="would lose work"):
        jj.workspaces.forget("ENG-2")
    # a resolve worker fixes the file in place; then it merges
    (second / "shared.txt").write_text("line 1\nONE and TWO\nline 3\n")
    jj.workspaces.snapshot("ENG-2")
    assert not workspaces(jj)["ENG-2"].conflicted
    resolved = jj.merger.merge("ENG-2")
    assert resolved.merged, resolved.detail
    assert show(jj, "main", "shared.txt") == "line 1\nONE and TWO\nline 3\n"


# --- stale ------------------------------------------------------------------------


def stale(jj: JjRepository, name: str) -> bool:
    """What jj itself says: a command in a stale workspace fails with "stale"."""
    result = jj.cli.run("log", "--no-graph", "-r", "@", "-T", "commit_id",
                        cwd=jj.workspaces.workspace_path(name))
    return not result.ok and "stale" in result.stderr


def test_snapshot_repairs_a_stale_workspace_keeping_its_files(jj: JjRepository, repo: Path) -> None:
    path = work(jj, "ENG-1", {"mine.txt": "mine\n"})
    work(jj, "ENG-2", {"other.txt": "other\n"})
    assert not any(stale(jj, w.name) for w in jj.workspaces.list_workspaces())
    # someone (a person in the default workspace) rewrites ENG-1's @ with other content
    jj.cli.run("rebase", "-r", '"ENG-1"@', "-o", '"ENG-2"@', cwd=repo).check()
    assert stale(jj, "ENG-1") and not stale(jj, "ENG-2")
    jj.workspaces.snapshot("ENG-1")
    assert not stale(jj, "ENG-1")
    assert (path / "other.txt").read_text() == "other\n"
    assert (path / "mine.txt").read_text() == "mine\n"


def test_list_workspaces_costs_one_jj_call_whatever_their_number(jj: JjRepository) -> None:
    for i in range(1, 5):
        work(jj, f"ENG-{i}", {f"f{i}": "x\n"})
    fresh = JjRepository.open(jj.cli.repo, jj.home.root, jj_bin=jj.cli.jj_bin)
    assert len(fresh.workspaces.list_workspaces()) == 4
    assert fresh.cli.calls == 1
    fresh.workspaces.list_workspaces()
    assert fresh.cli.calls == 1  # nothing happened in the repository: nothing to ask


def test_a_listing_is_read_again_after_any_operation(jj: JjRepository) -> None:
    path = jj.workspaces.add_workspace("ENG-1")
    fresh = JjRepository.open(jj.cli.repo, jj.home.root, jj_bin=jj.cli.jj_bin)
    (before,) = fresh.workspaces.list_workspaces()
    assert not before.has_unmerged_change
    work(jj, "ENG-2", {"f2": "x\n"})  # another process's operations
    assert [w.name for w in fresh.workspaces.list_workspaces()] == ["ENG-1", "ENG-2"]
    (path / "f1").write_text("x\n")
    calls = fresh.cli.calls
    assert fresh.workspaces.list_workspaces()[0] == before  # not snapshotted yet: as it was
    assert fresh.cli.calls == calls
    jj.workspaces.snapshot("ENG-1")  # an operation: read again, and the change is there
    assert fresh.workspaces.list_workspaces()[0].has_unmerged_change
    assert fresh.cli.calls == calls + 1


# --- forget -----------------------------------------------------------------------


def test_forget_only_after_merge(jj: JjRepository) -> None:
    path = work(jj, "ENG-1", {"f.txt": "f\n"})
    with pytest.raises(JJError, match="would lose work"):
        jj.workspaces.forget("ENG-1")
    assert path.is_dir() and [w.name for w in jj.workspaces.list_workspaces()] == ["ENG-1"]
    # unsnapshotted edits count too
    assert jj.merger.merge("ENG-1").merged
    (path / "late.txt").write_text("late\n")
    with pytest.raises(JJError, match="would lose work"):
        jj.workspaces.forget("ENG-1")
    assert jj.merger.merge("ENG-1").merged
    jj.workspaces.forget("ENG-1")
    assert not path.exists()
    assert jj.workspaces.list_workspaces() == []
    jj.workspaces.forget("ENG-1")  # idempotent
    assert show(jj, "main", "late.txt") == "late\n"
    bookmarks = jj.cli.run("--ignore-working-copy", "bookmark", "list", "-T", 'name ++ "\\n"')
    assert bookmarks.check().lines() == ["main"]


def test_forget_empty_workspace(jj: JjRepository) -> None:
    path = jj.workspaces.add_workspace("ENG-4")
    jj.workspaces.forget("ENG-4")
    assert not path.exists()


def test_forget_canceled_keeps_the_change_under_a_bookmark(jj: JjRepository, jj_bin: str) -> None:
    path = work(jj, "ENG-8", {"canceled.txt": "maybe later\n"}, "ENG-8: canceled work")
    _jj(jj_bin, path, "new")  # newest change empty: the bookmark must still hold the work
    jj.workspaces.forget("ENG-8", keep_bookmark=True)
    assert not path.exists()
    assert show(jj, "ralph/ENG-8", "canceled.txt") == "maybe later\n"
    assert "canceled.txt" not in trunk_files(jj)
    # the tip of the kept change, not an empty child
    desc = jj.cli.run(
        "--ignore-working-copy", "log", "--no-graph", "-r", '"ralph/ENG-8"', "-T", "description"
    ).check()
    assert desc.stdout.strip() == "ENG-8: canceled work"


def test_orphan_directory_is_never_removed(jj: JjRepository, tmp_path: Path) -> None:
    orphan = tmp_path / "workspaces" / "ENG-9"
    orphan.mkdir(parents=True)
    (orphan / "edits.txt").write_text("unsaved\n")
    jj.workspaces.forget("ENG-9")
    assert (orphan / "edits.txt").read_text() == "unsaved\n"


# --- the whole story: nothing lost -------------------------------------------------


def test_nothing_is_lost(jj: JjRepository, repo: Path) -> None:
    contents = {
        "ENG-1": ("one.txt", "one\n"),
        "ENG-2": ("two.txt", "two\n"),
        "ENG-3": ("shared.txt", "line 1\nTHREE\nline 3\n"),
        "ENG-4": ("shared.txt", "line 1\nFOUR\nline 3\n"),
        "ENG-5": ("five.txt", "five\n"),
    }
    for name, (rel, text) in contents.items():
        work(jj, name, {rel: text})
    assert jj.merger.merge("ENG-1").merged
    assert jj.merger.merge("ENG-3").merged
    assert jj.merger.merge("ENG-4").conflicted
    assert jj.merger.merge("ENG-2").merged
    jj.workspaces.forget("ENG-5", keep_bookmark=True)  # canceled
    for name in ("ENG-1", "ENG-2", "ENG-3"):
        jj.workspaces.forget(name)
    for name in ("ENG-4",):
        with pytest.raises(JJError):
            jj.workspaces.forget(name)
    # every change's content is reachable
    assert show(jj, "main", "one.txt") == "one\n"
    assert show(jj, "main", "two.txt") == "two\n"
    assert show(jj, "main", "shared.txt") == "line 1\nTHREE\nline 3\n"
    assert show(jj, "ralph/ENG-5", "five.txt") == "five\n"
    conflicted = show(jj, '"ENG-4"@', "shared.txt")
    assert "FOUR" in conflicted and "THREE" in conflicted
    assert [w.name for w in jj.workspaces.list_workspaces()] == ["ENG-4"]
    # the person's own working copy was never rewritten
    assert jj.cli.run("status", cwd=repo).ok


def test_trunk_checkout_follows_trunk_and_drops_scratch(jj: JjRepository) -> None:
    checkout = jj.trunk.trunk_checkout()
    assert (checkout / "README").exists()
    assert checkout.parent == jj.home.root.resolve()
    work(jj, "ENG-1", {"one.txt": "one\n"})
    assert jj.merger.merge("ENG-1").merged
    assert jj.trunk.trunk_checkout() == checkout
    assert (checkout / "one.txt").read_text() == "one\n"
    # the verify command leaves junk behind; the next checkout drops it
    (checkout / "junk.pyc").write_text("junk\n")
    work(jj, "ENG-2", {"two.txt": "two\n"})
    assert jj.merger.merge("ENG-2").merged
    assert jj.trunk.trunk_checkout() == checkout
    assert (checkout / "two.txt").read_text() == "two\n"
    assert not (checkout / "junk.pyc").exists()
    junk = jj.cli.run(
        "--ignore-working-copy", "log", "--no-graph", "-r", 'all() ~ ::main ~ working_copies()',
        "-T", 'commit_id ++ "\\n"',
    ).check()
    assert junk.lines() == []
    # unchanged trunk: nothing to do, still the same files
    assert jj.trunk.trunk_checkout() == checkout
    # deleted by hand: rebuilt
    import shutil

    shutil.rmtree(checkout)
    assert jj.trunk.trunk_checkout() == checkout
    assert (checkout / "two.txt").read_text() == "two\n"
    assert [w.name for w in jj.workspaces.list_workspaces()] == ["ENG-1", "ENG-2"]


def test_workspace_directory_deleted_by_hand(jj: JjRepository) -> None:
    import shutil

    path = work(jj, "ENG-1", {"one.txt": "one\n"})
    shutil.rmtree(path)
    assert [w.name for w in jj.workspaces.list_workspaces()] == ["ENG-1"]
    with pytest.raises(JJError, match="is gone"):
        jj.workspaces.add_workspace("ENG-1")
    with pytest.raises(JJError, match="would lose work"):
        jj.workspaces.forget("ENG-1")
    jj.workspaces.forget("ENG-1", keep_bookmark=True)
    assert show(jj, "ralph/ENG-1", "one.txt") == "one\n"
    assert jj.workspaces.list_workspaces() == []
    assert jj.workspaces.add_workspace("ENG-1") == path


def test_describe_takes_hostile_text_as_data(jj: JjRepository, tmp_path: Path) -> None:
    path = jj.workspaces.add_workspace("ENG-1")
    (path / "f.txt").write_text("f\n")
    marker = tmp_path / "pwned"
    message = f"--help -rf $(touch {marker}) `touch {marker}`; rm -rf ~\nC-c Enter \x1b[31m\x00end"
    jj.workspaces.describe("ENG-1", message)
    desc = jj.cli.run(
        "--ignore-working-copy", "log", "--no-graph", "-r", '"ENG-1"@', "-T", "description"
    ).check().stdout
    assert desc.strip() == message.replace("\x00", "")
    assert not marker.exists()


def test_files_jj_refuses_to_record_are_never_deleted(jj: JjRepository) -> None:
    path = work(jj, "ENG-1", {"small.txt": "small\n"})
    big = path / "data: big.bin"
    big.write_bytes(b"x" * (1024 * 1024 + 10))
    assert jj.workspaces.snapshot("ENG-1") == ["data: big.bin"]
    before = trunk_commit(jj)
    with pytest.raises(JJError, match=r"did not record data: big.bin.*\.gitignore"):
        jj.merger.merge("ENG-1")
    assert trunk_commit(jj) == before
    with pytest.raises(JJError, match="did not record"):
        jj.workspaces.forget("ENG-1", keep_bookmark=True)
    assert big.exists()
    big.unlink()
    assert jj.workspaces.snapshot("ENG-1") == []
    assert jj.merger.merge("ENG-1").merged


def test_reopened_canceled_issue_resumes_its_kept_change(jj: JjRepository) -> None:
    work(jj, "ENG-8", {"kept.txt": "kept\n"}, "ENG-8: first try")
    jj.workspaces.forget("ENG-8", keep_bookmark=True)
    path = jj.workspaces.add_workspace("ENG-8")
    assert (path / "kept.txt").read_text() == "kept\n"
    (path / "more.txt").write_text("more\n")
    jj.workspaces.describe("ENG-8", "ENG-8: second try")
    assert jj.merger.merge("ENG-8").merged
    assert jj.trunk.trunk_log(3) == ["ENG-8: second try", "ENG-8: first try", "first"]
    jj.workspaces.forget("ENG-8")
    bookmarks = jj.cli.run("--ignore-working-copy", "bookmark", "list", "-T", 'name ++ "\\n"')
    assert bookmarks.check().lines() == ["main"]


def test_trunk_with_a_slash_in_its_name(tmp_path: Path, jj_bin: str) -> None:
    repo = make_repo(jj_bin, tmp_path / "repo")
    _jj(jj_bin, repo, "bookmark", "rename", "main", "release/v1.0")
    jj = JjRepository.open(repo, tmp_path / "ws", "release/v1.0", jj_bin=jj_bin)
    jj.trunk.check_repo()
    work(jj, "ENG-1", {"x.txt": "x\n"})
    assert jj.merger.merge("ENG-1").merged
    assert jj.trunk.trunk_log(2) == ["ENG-1: work", "first"]
    assert not jj.workspaces.list_workspaces()[0].has_unmerged_change


def follow(message: str, jj_bin: str) -> None:
    """Run the jj command a refusal names, exactly as written, where it says."""
    found = re.search(r"`(jj [^`]+)` in (\S+?)[\s)]", message + " ")
    assert found is not None, message
    argv = shlex.split(found.group(1))
    _jj(jj_bin, Path(found.group(2)), *argv[1:])


def test_a_workspace_whose_directory_is_gone_is_fixed_as_the_error_says(
        jj: JjRepository, jj_bin: str) -> None:
    shutil.rmtree(jj.workspaces.add_workspace("KV-1"))
    with pytest.raises(JJError, match="is gone") as refused:
        jj.workspaces.add_workspace("KV-1")
    follow(str(refused.value), jj_bin)
    assert jj.workspaces.add_workspace("KV-1").is_dir()  # works again


def test_a_workspace_of_the_same_name_elsewhere_is_fixed_as_the_error_says(
        jj: JjRepository, repo: Path, tmp_path: Path, jj_bin: str) -> None:
    _jj(jj_bin, repo, "workspace", "add", "--name", "KV-2", str(tmp_path / "elsewhere"))
    with pytest.raises(JJError, match="not under") as refused:
        jj.workspaces.add_workspace("KV-2")
    follow(str(refused.value), jj_bin)
    assert jj.workspaces.add_workspace("KV-2").is_dir()


def test_a_file_too_large_to_record_is_fixed_by_raising_the_limit_as_the_error_says(
        jj: JjRepository, jj_bin: str) -> None:
    path = jj.workspaces.add_workspace("KV-3")
    (path / "model.bin").write_bytes(b"x" * (2 * 1024 * 1024))
    with pytest.raises(JJError, match=r"did not record model\.bin") as refused:
        jj.workspaces.describe("KV-3", "KV-3: big")
    message = str(refused.value).replace("SIZE", "4MiB")  # the one word a person fills in
    follow(message, jj_bin)
    jj.workspaces.describe("KV-3", "KV-3: big")
    assert jj.merger.merge("KV-3").merged
    assert "model.bin" in trunk_files(jj)


def test_a_stale_working_copy_is_repaired_before_git_import_and_export(
        jj: JjRepository, repo: Path, jj_bin: str) -> None:
    """Issue 25 item 7: a merge killed right after it rebased a workspace's change leaves
    that workspace's working copy stale (its files no longer match its rewritten @); the
    retry's first jj steps in it (taking in the person's git commits, exporting trunk)
    repair it instead of failing "The working copy is stale" and holding the issue."""
    path = jj.workspaces.add_workspace("ENG-2")
    (path / "two.txt").write_text("two\n")
    jj.workspaces.snapshot("ENG-2")
    (repo / "person.txt").write_text("a person's commit\n")  # trunk moves
    _jj(jj_bin, repo, "commit", "-m", "person")
    _jj(jj_bin, repo, "bookmark", "set", "main", "-r", "@-")
    _jj(jj_bin, repo, "rebase", "-r", '"ENG-2"@', "-d", "main")  # from outside, as a merge
    assert "stale" in jj.cli.run("git", "import", cwd=path).stderr  # the trap itself
    jj.home.import_from_git(path)
    jj.home.export_to_git(path)
    assert jj.cli.run("git", "import", cwd=path).ok  # repaired
    assert (path / "two.txt").read_text() == "two\n" and (path / "person.txt").exists()


# --- a new workspace's bookmark, set beside the spawn ---------------------------------------


def slow_bookmarks(jj_bin: str, tmp_path: Path, *, fail: bool = False) -> str:
    """A jj whose ``bookmark set`` takes half a second (or fails): the bookmark a new
    workspace gets beside its spawn is then surely still being set when the caller goes
    on."""
    wrapper = tmp_path / "bin" / "jj"
    wrapper.parent.mkdir(exist_ok=True)
    then = "echo 'Error: no' >&2; exit 1" if fail else "sleep 0.5"
    wrapper.write_text(f'#!/bin/sh\ncase " $* " in *" bookmark set "*) {then};; esac\n'
                       f'exec {shlex.quote(jj_bin)} "$@"\n')
    wrapper.chmod(0o755)
    git = Path(child_path(jj_bin).split(":")[0]) / "git"
    if git.exists():  # jj's own git first on the wrapper's PATH too
        (wrapper.parent / "git").symlink_to(git)
    return str(wrapper)


def test_a_new_workspaces_bookmark_is_there_for_the_next_jj_call(repo: Path, tmp_path: Path,
                                                                  jj_bin: str) -> None:
    """The spawn does not wait for ``ralph/NAME`` (a jj process of its own); whatever
    asks jj next, in this process, sees it set."""
    jj = JjRepository.open(repo, tmp_path / "workspaces", "main",
                           jj_bin=slow_bookmarks(jj_bin, tmp_path))
    jj.workspaces.add_workspace("ENG-1")
    assert jj.cli.count("present(ralph/ENG-1) & ENG-1@") == 1


def test_a_process_that_adds_a_workspace_and_exits_leaves_its_bookmark_set(
        repo: Path, tmp_path: Path, jj_bin: str) -> None:
    wrapper = slow_bookmarks(jj_bin, tmp_path)
    code = ("import sys; from pathlib import Path; "
            "from ralph_dev.adapters.jj import JjRepository; "
            "JjRepository.open(Path(sys.argv[1]), Path(sys.argv[2]), 'main', "
            "jj_bin=sys.argv[3]).workspaces.add_workspace('ENG-2')")
    subprocess.run([sys.executable, "-c", code, str(repo), str(tmp_path / "workspaces"),
                    wrapper], check=True, timeout=60)
    jj = JjRepository.open(repo, tmp_path / "workspaces", "main", jj_bin=jj_bin)
    assert jj.cli.count("present(ralph/ENG-2) & ENG-2@") == 1


def test_a_bookmark_that_could_not_be_set_beside_is_said_and_set_at_the_next_reuse(
        repo: Path, tmp_path: Path, jj_bin: str) -> None:
    failing = JjRepository.open(repo, tmp_path / "workspaces", "main",
                                jj_bin=slow_bookmarks(jj_bin, tmp_path, fail=True))
    with structlog.testing.capture_logs() as logs:
        path = failing.workspaces.add_workspace("ENG-3")
        failing.cli.settle()
    (said,) = [e for e in logs if e["event"] == "jj_beside_failed"]
    assert "ralph/ENG-3" in said["why"] and "Error: no" in said["error"]
    jj = JjRepository.open(repo, tmp_path / "workspaces", "main", jj_bin=jj_bin)
    assert jj.cli.count("present(ralph/ENG-3)") == 0
    assert jj.workspaces.add_workspace("ENG-3") == path  # the next spawn reuses it
    assert jj.cli.count("present(ralph/ENG-3) & ENG-3@") == 1
