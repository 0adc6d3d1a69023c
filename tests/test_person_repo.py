"""ralph-dev on a person's real repository: their checkout, their git and their ``@`` stay
exactly as they were; only trunk moves, and their git sees it move.

The repository is made the way a person has one (a plain git repo made with Debian's
git 2.39, uncommitted work in it), colocated with ``jj git init --colocate``, then
worked on through the jj adapter with the real jj.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from swarm_kit import assert_git_reads, checkout_state, git, leftovers, make_person_repo

from ralph_dev.adapters.jj import JjRepository
from ralph_dev.adapters.process import CommandResult
from ralph_dev.core.errors import WorkspaceHookFailed

PERSON = {"JJ_USER": "Pat", "JJ_EMAIL": "pat@example.com"}


def person_jj(jj_bin: str, repo: Path, *args: str) -> str:
    """The person running jj in their checkout, as themselves."""
    proc = subprocess.run([jj_bin, "--no-pager", "--color", "never", *args], cwd=repo,
                          env={**os.environ, **PERSON}, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def colocated_person_repo(tmp_path: Path, jj_bin: str, *, branch: str = "main") -> Path:
    repo = make_person_repo(tmp_path / "repo", branch=branch)
    person_jj(jj_bin, repo, "git", "init", "--colocate")
    return repo


def work(jj: JjRepository, name: str, files: dict[str, str]) -> Path:
    path = jj.workspaces.add_workspace(name)
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    jj.workspaces.describe(name, f"{name}: work")
    return path


@pytest.mark.parametrize("person", ["git user", "jj user"])
def test_a_whole_run_leaves_the_checkout_alone_and_git_sees_trunk(
    tmp_path: Path, jj_bin: str, person: str
) -> None:
    repo = colocated_person_repo(tmp_path, jj_bin)
    if person == "jj user":
        person_jj(jj_bin, repo, "new")  # jj detaches git's HEAD at the person's change
    status_before = git(repo, "status", "--porcelain").stdout  # (refreshes git's index)
    before = checkout_state(repo, jj_bin)
    jj = JjRepository.open(repo, tmp_path / "workspaces", "main", jj_bin=jj_bin)
    jj.trunk.check_repo()

    work(jj, "ENG-1", {"one.txt": "one\n"})
    work(jj, "ENG-2", {"src/two.txt": "two\n"})
    work(jj, "ENG-3", {"canceled.txt": "maybe later\n"})
    assert jj.merger.merge("ENG-1").merged
    assert jj.merger.merge("ENG-2").merged
    assert jj.trunk.trunk_checkout().is_dir()
    jj.workspaces.forget("ENG-1")
    jj.workspaces.forget("ENG-2")
    jj.workspaces.forget("ENG-3", keep_bookmark=True)
    work(jj, "ENG-4", {"four.txt": "four\n"})  # a workspace still open

    after = checkout_state(repo, jj_bin)
    assert_git_reads(repo, jj_bin)
    if person == "git user":
        # HEAD was attached to main, which moved: jj detached it where it was, so the
        # checkout is still what HEAD names and git shows no phantom changes
        assert before["git_HEAD_file"] == "ref: refs/heads/main\n"
        assert after["git_HEAD_file"] == after["HEAD"] + "\n"
        before["git_HEAD_file"] = after["git_HEAD_file"]
    assert after == before
    # the person's git sees trunk's branch at the merged work
    trunk = jj.trunk.trunk_commit()
    assert git(repo, "rev-parse", "main").stdout.strip() == trunk
    assert git(repo, "log", "--format=%s", "main", "-3").stdout.splitlines() == [
        "ENG-2: work", "ENG-1: work", "initial commit"]
    # git reports the person's uncommitted work exactly as before, nothing else
    assert git(repo, "status", "--porcelain").stdout == status_before

    # the README's one line to bring a git checkout up to date
    if person == "git user":
        switched = git(repo, "checkout", "main")
        assert switched.returncode == 0, switched.stderr
        assert (repo / "one.txt").read_text() == "one\n"
        assert (repo / "src/two.txt").read_text() == "two\n"
        assert (repo / "scratch.txt").exists()
        assert "half-written line" in (repo / "README.md").read_text()
    else:
        person_jj(jj_bin, repo, "rebase", "-d", "main")
        assert (repo / "one.txt").read_text() == "one\n"
        assert "half-written line" in (repo / "README.md").read_text()
    assert_git_reads(repo, jj_bin)


def test_the_persons_own_git_commits_on_trunk_are_built_upon(tmp_path: Path,
                                                               jj_bin: str) -> None:
    repo = colocated_person_repo(tmp_path, jj_bin, branch="master")
    jj = JjRepository.open(repo, tmp_path / "workspaces", "master", jj_bin=jj_bin)
    work(jj, "ENG-1", {"one.txt": "one\n"})
    # meanwhile the person commits on master with their own git
    assert git(repo, "commit", "-q", "-m", "person: staged file").returncode == 0
    theirs = git(repo, "rev-parse", "HEAD").stdout.strip()
    assert jj.merger.merge("ENG-1").merged
    log = git(repo, "log", "--format=%H %s", "master", "-3").stdout.splitlines()
    assert [line.split(" ", 1)[1] for line in log] == [
        "ENG-1: work", "person: staged file", "initial commit"]
    assert log[1].startswith(theirs)
    assert_git_reads(repo, jj_bin)


def test_a_merge_killed_before_its_export_reaches_git_on_the_next_attempt(
        tmp_path: Path, jj_bin: str) -> None:
    repo = colocated_person_repo(tmp_path, jj_bin)
    jj = JjRepository.open(repo, tmp_path / "workspaces", "main", jj_bin=jj_bin)
    work(jj, "ENG-1", {"one.txt": "one\n"})
    before = git(repo, "rev-parse", "main").stdout.strip()
    real = jj.cli.run
    moved: list[bool] = []

    def dies_before_export(*args: str, cwd: Path | None = None,
                           touch_checkout: bool = False) -> CommandResult:
        if args[:2] == ("git", "export") and moved:
            raise KeyboardInterrupt("killed after trunk moved, before git heard of it")
        moved.extend([True] if args[:3] == ("bookmark", "set", "main") else [])
        return real(*args, cwd=cwd, touch_checkout=touch_checkout)

    jj.cli.run = dies_before_export  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        jj.merger.merge("ENG-1")
    del jj.cli.run
    assert jj.trunk.trunk_commit() != before
    assert git(repo, "rev-parse", "main").stdout.strip() == before  # git has not seen it
    # the controller's next attempt finds the work in trunk, and git is told now
    assert not jj.merger.merge("ENG-1").merged
    assert git(repo, "rev-parse", "main").stdout.strip() == jj.trunk.trunk_commit()
    assert_git_reads(repo, jj_bin)


def test_forget_removes_the_workspace_with_its_build_outputs(tmp_path: Path,
                                                             jj_bin: str) -> None:
    repo = colocated_person_repo(tmp_path, jj_bin)
    jj = JjRepository.open(repo, tmp_path / "workspaces", "main", jj_bin=jj_bin)
    path = work(jj, "ENG-1", {"one.txt": "one\n"})
    for junk in ("node_modules/left-pad/index.js", "target/debug/deps/big.rlib",
                 "node_modules/.bin/tool"):
        (path / junk).parent.mkdir(parents=True, exist_ok=True)
        (path / junk).write_bytes(b"x" * 4096)
    (path / "node_modules/link").symlink_to(repo)  # a link out must not be followed
    assert jj.workspaces.snapshot("ENG-1") == []  # ignored: not recorded, not refused
    assert jj.merger.merge("ENG-1").merged
    seen: list[Path] = []
    jj.workspaces.forget("ENG-1", before_remove=seen.append)
    assert seen == [path]
    assert not path.exists() and not path.is_symlink()
    assert not leftovers(path.parent)
    assert (repo / "README.md").exists()  # the link's target is untouched


def test_a_failed_after_create_leaves_no_workspace(tmp_path: Path, jj_bin: str) -> None:
    repo = colocated_person_repo(tmp_path, jj_bin)
    jj = JjRepository.open(repo, tmp_path / "workspaces", "main", jj_bin=jj_bin)

    def broken_install(path: Path) -> None:
        (path / "node_modules").mkdir()
        raise WorkspaceHookFailed("npm ci failed (exit 1)", retryable=True)

    with pytest.raises(WorkspaceHookFailed, match="npm ci"):
        jj.workspaces.add_workspace("ENG-1", after_create=broken_install)
    assert not jj.workspaces.workspace_path("ENG-1").exists()
    assert jj.workspaces.list_workspaces() == []
    bookmarks = jj.cli.run("bookmark", "list", "-T", 'name ++ "\\n"').check().lines()
    assert bookmarks == ["main"]

    # a hook whose output jj would track (and so merge into trunk) fails the spawn too
    def copies_unignored_secrets(path: Path) -> None:
        (path / "settings.local").write_text("TOKEN=secret\n")
        (path / ".env").write_text("IGNORED=1\n")  # ignored: fine

    with pytest.raises(WorkspaceHookFailed, match=r"settings\.local.*\.gitignore") as err:
        jj.workspaces.add_workspace("ENG-1", after_create=copies_unignored_secrets)
    assert err.value.retryable is False
    assert jj.workspaces.list_workspaces() == []
    stray = jj.cli.run("log", "--no-graph", "-r", "all() ~ ::main ~ working_copies()",
                   "-T", 'commit_id ++ "\\n"').check().lines()
    assert stray == []

    # a working hook runs once, in the new workspace, before it is handed out
    ran: list[Path] = []
    path = jj.workspaces.add_workspace("ENG-1", after_create=ran.append)
    assert ran == [path]
    assert jj.workspaces.add_workspace("ENG-1", after_create=ran.append) == path
    assert ran == [path]  # reused: not run again


KILLED_IN_HOOK = """
import os, signal, sys
from pathlib import Path
from ralph_dev.adapters.jj import JjRepository
from ralph_dev.adapters.process import CommandResult

def install_then_die(path: Path) -> None:
    (path / "node_modules").mkdir()
    (path / "node_modules" / "half-written.js").write_text("// cut short")
    os.kill(os.getpid(), signal.SIGKILL)  # the controller dies in the middle of the hook

repo, root, jj_bin = sys.argv[1:]
JjRepository.open(Path(repo), Path(root), "main", jj_bin=jj_bin).workspaces.add_workspace(
    "ENG-1", after_create=install_then_die)
"""


def test_a_spawn_killed_during_after_create_is_made_again(tmp_path: Path,
                                                          jj_bin: str) -> None:
    repo = colocated_person_repo(tmp_path, jj_bin)
    jj = JjRepository.open(repo, tmp_path / "workspaces", "main", jj_bin=jj_bin)
    killed = subprocess.run([sys.executable, "-c", KILLED_IN_HOOK, str(repo),
                             str(jj.home.root), jj_bin], capture_output=True, text=True,
                            check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    half = jj.workspaces.workspace_path("ENG-1")
    assert (half / "node_modules/half-written.js").exists()

    ran: list[Path] = []
    path = jj.workspaces.add_workspace("ENG-1", after_create=ran.append)
    assert ran == [path]  # the hook ran again, in a workspace made anew
    assert not (path / "node_modules").exists()
    assert [w.name for w in jj.workspaces.list_workspaces()] == ["ENG-1"]
    # one fresh change under ralph/ENG-1, none left over from the killed attempt
    assert jj.cli.run("log", "--no-graph", "-r", "all() ~ ::main ~ working_copies()",
                  "-T", 'commit_id ++ "\\n"').check().lines() == []
    assert jj.cli.run("log", "--no-graph", "-r", '"ralph/ENG-1" & "ENG-1"@', "-T",
                  '"x"').check().stdout == "x"
    assert not leftovers(jj.home.root) - {"ENG-1"} - {
        p.relative_to(jj.home.root).as_posix() for p in path.rglob("*")}


def test_the_base_workspace_comes_back_after_being_deleted(tmp_path: Path,
                                                           jj_bin: str) -> None:
    repo = colocated_person_repo(tmp_path, jj_bin)
    before = checkout_state(repo, jj_bin)
    jj = JjRepository.open(repo, tmp_path / "workspaces", "main", jj_bin=jj_bin)
    work(jj, "ENG-1", {"one.txt": "one\n"})
    shutil.rmtree(jj.home.root / ".ralph-base")
    assert jj.merger.merge("ENG-1").merged
    jj.workspaces.forget("ENG-1")
    names = jj.cli.run("workspace", "list", "-T", 'name ++ "\\n"').check().lines()
    assert sorted(names) == ["default", "ralph-base"]
    after = checkout_state(repo, jj_bin)
    assert after.pop("git_HEAD_file") != before.pop("git_HEAD_file")  # detached: main moved
    assert after == before


def test_no_jj_command_of_ralph_devs_snapshots_the_persons_working_copy(
    tmp_path: Path, jj_bin: str
) -> None:
    """Even a command written without --ignore-working-copy gets it outside ralph-dev's
    workspaces: the person's new file stays untracked and their ``@`` unchanged."""
    repo = colocated_person_repo(tmp_path, jj_bin)
    (repo / "new-untracked.txt").write_text("new\n")
    before = checkout_state(repo, jj_bin)
    jj = JjRepository.open(repo, tmp_path / "workspaces", "main", jj_bin=jj_bin)
    for where in (None, repo, repo / ".."):
        assert jj.cli.run("status", cwd=where).ok or where == repo / ".."
        assert jj.cli.run("log", "-r", "@", cwd=where).ok or where == repo / ".."
    assert checkout_state(repo, jj_bin) == before
    # in its own workspaces jj does snapshot (that is how agents' edits are recorded)
    path = jj.workspaces.add_workspace("ENG-1")
    (path / "agent.txt").write_text("edit\n")
    assert jj.cli.run("status", cwd=path).check().stdout.count("agent.txt") == 1
