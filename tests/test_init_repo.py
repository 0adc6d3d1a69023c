"""``ralph-dev init`` looks at the repository: a plain git repository is named as such and
colocated only when asked, trunk is what the person works on, and every refusal's
suggested command works when a person runs it as written."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from swarm_kit import assert_git_reads, git, make_person_repo

from ralph_dev.adapters.jj import JjRepository
from ralph_dev.adapters.jj_cli import JJError
from ralph_dev.cli import main
from ralph_dev.core.config import load_project
from ralph_dev.core.paths import config_file


def init(repo: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["init", "app", "--repo", str(repo), *args])


def suggested_command(message: str) -> str:
    """The first command a message tells the person to run (the text in backticks)."""
    found = re.search(r"`((?:jj|git) [^`]+)`", message)
    assert found, f"no command suggested in: {message}"
    return found.group(1)


def run_as_person(command: str, repo: Path, jj_bin: str) -> None:
    """Type ``command`` in ``repo`` as a person with a fresh HOME (no jj identity set)."""
    home = repo.parent / "person-home"
    home.mkdir(exist_ok=True)
    env = {"HOME": str(home), "PATH": f"{Path(jj_bin).parent}:{os.defpath}"}
    proc = subprocess.run(["/bin/sh", "-c", command], cwd=repo, env=env, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, f"{command}: {proc.stderr}"


def test_a_plain_git_repo_is_named_and_colocated_only_when_asked(
    xdg: Path, tmp_path: Path, jj_bin: str
) -> None:
    repo = make_person_repo(tmp_path / "repo", branch="master")
    files = sorted(p.name for p in repo.iterdir())
    status = git(repo, "status", "--porcelain").stdout
    refused = init(repo)
    assert refused.exit_code != 0
    assert "is a git repository but not a jj one" in refused.output
    assert "--colocate" in refused.output and "jj git init --colocate" in refused.output
    assert sorted(p.name for p in repo.iterdir()) == files  # nothing made
    assert not config_file().exists()

    result = init(repo, "--colocate")
    assert result.exit_code == 0, result.output
    assert "made" in result.output and "colocated jj repository" in result.output
    assert "trunk: master (the branch git's HEAD is on)" in result.output
    assert load_project("app", environ={}).trunk == "master"
    assert (repo / ".jj").is_dir()
    assert git(repo, "symbolic-ref", "HEAD").stdout.strip() == "refs/heads/master"
    assert_git_reads(repo, jj_bin)
    assert git(repo, "status", "--porcelain").stdout.count("README.md") == status.count(
        "README.md")  # the person's edit is still an edit
    JjRepository.open(repo, tmp_path / "ws", "master", jj_bin=jj_bin).trunk.check_repo()

    again = CliRunner().invoke(main, ["init", "app", "--repo", str(repo), "--colocate",
                                      "--force"])
    assert again.exit_code == 0 and "--colocate changed nothing" in again.output


def test_the_colocate_command_in_the_message_works_when_run_by_hand(
    xdg: Path, tmp_path: Path, jj_bin: str
) -> None:
    repo = make_person_repo(tmp_path / "repo")
    message = init(repo).output
    run_as_person(re.search(r"`(jj git init --colocate)`", message).group(1), repo, jj_bin)
    result = init(repo)
    assert result.exit_code == 0, result.output
    assert "trunk: main (the branch git's HEAD is on)" in result.output


def test_an_empty_directory_gets_a_command_that_makes_a_repository(
    xdg: Path, tmp_path: Path, jj_bin: str
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "notes.txt").write_text("a start\n")
    refused = init(repo)
    assert refused.exit_code != 0 and "is not a repository" in refused.output
    run_as_person(suggested_command(refused.output), repo, jj_bin)
    result = init(repo)
    assert result.exit_code == 0, result.output
    assert "trunk: main (the repository's 'main' bookmark)" in result.output


def test_a_jj_repo_without_commits_or_trunk_gets_commands_that_work(
    xdg: Path, tmp_path: Path, jj_bin: str
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    run_as_person("jj git init", repo, jj_bin)
    (repo / "code.py").write_text("print('hi')\n")
    refused = init(repo)
    assert refused.exit_code != 0 and "no commits yet" in refused.output
    run_as_person(suggested_command(refused.output), repo, jj_bin)
    assert init(repo).exit_code == 0

    repo2 = tmp_path / "repo2"
    repo2.mkdir()
    run_as_person("jj git init && jj commit -m first", repo2, jj_bin)
    refused = init(repo2, "--force")
    assert refused.exit_code != 0
    assert "create it at your working copy's parent" in refused.output
    run_as_person(suggested_command(refused.output), repo2, jj_bin)
    assert init(repo2, "--force").exit_code == 0


def test_trunk_under_another_name_is_asked_for_not_invented(
    xdg: Path, tmp_path: Path, jj_bin: str
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    run_as_person("jj git init && jj commit -m first && jj bookmark create develop -r @-",
                  repo, jj_bin)
    refused = init(repo)
    assert refused.exit_code != 0
    assert "its bookmarks are develop; pass --trunk with the one" in refused.output
    result = init(repo, "--trunk", "develop")
    assert result.exit_code == 0, result.output
    assert "trunk: develop (as given)" in result.output
    wrong = init(repo, "--trunk", "mian", "--force")
    assert wrong.exit_code != 0 and "no bookmark 'mian'" in wrong.output


@pytest.mark.parametrize("kind", ["git repo", "empty dir", "no trunk"])
def test_a_configured_repos_fixes_work_when_followed(tmp_path: Path, jj_bin: str,
                                                      kind: str) -> None:
    """``start``/``doctor`` check the configured repository; their fixes work too."""
    repo = tmp_path / "repo"
    if kind == "git repo":
        make_person_repo(repo)
    else:
        repo.mkdir()
        (repo / "a.txt").write_text("a\n")
        if kind == "no trunk":
            run_as_person("jj git init && jj commit -m first", repo, jj_bin)
    jj = JjRepository.open(repo, tmp_path / "ws", "main", jj_bin=jj_bin)
    for _ in range(2):  # an empty directory takes two steps: a repository, then trunk
        try:
            jj.trunk.check_repo()
            break
        except JJError as exc:
            run_as_person(suggested_command(str(exc)), repo, jj_bin)
    jj.trunk.check_repo()
