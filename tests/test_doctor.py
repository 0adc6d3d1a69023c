"""``ralph-dev doctor`` checks what a person's machine really runs: the Claude Code that
``scripts/setup.sh`` installed, the git on their own PATH, and that their git can still
open their repository (with a fix that works when it cannot)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from swarm_kit import SYSTEM_GIT, make_person_repo, person_gits

from ralph_dev.cli import main


def doctor_lines(project: str) -> dict[str, str]:
    out = CliRunner().invoke(main, ["doctor", project]).output
    return {m.group(2): m.group(1).strip() + " " + m.group(3)
            for m in re.finditer(r"^\[(OK  |FAIL)\] ([^:]+): (.*)$", out, re.M)}


@pytest.fixture
def project(xdg: Path, tmp_path: Path, jj_bin: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Project ``app`` on a person's git repository, colocated by init."""
    repo = make_person_repo(tmp_path / "repo")
    monkeypatch.setenv("RALPH_DEV_JJ", jj_bin)
    result = CliRunner().invoke(main, ["init", "app", "--repo", str(repo), "--colocate"])
    assert result.exit_code == 0, result.output
    return repo


def test_doctor_finds_the_claude_code_setup_installed(
    project: Path, xdg: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.environ.get("RALPH_DEV_CLAUDE_BIN")
    assert real, "the tests run with RALPH_DEV_CLAUDE_BIN set (see the brief)"
    # what scripts/setup.sh leaves: claude in the cache, not on PATH
    cached = xdg / "cache/ralph-dev/claude-code-2.1.197/node_modules/.bin/claude"
    cached.parent.mkdir(parents=True)
    cached.symlink_to(real)
    monkeypatch.delenv("RALPH_DEV_CLAUDE_BIN")
    monkeypatch.setenv("PATH", ":".join(p for p in os.environ["PATH"].split(":")
                                        if not (Path(p) / "claude").exists()))
    line = doctor_lines("app")["claude (app)"]
    assert line.startswith("OK") and str(cached) in line, line

    cached.unlink()
    line = doctor_lines("app")["claude (app)"]
    assert line.startswith("FAIL") and "scripts/setup.sh" in line


def test_doctor_checks_the_persons_git_and_that_it_reads_the_repo(
    project: Path, monkeypatch: pytest.MonkeyPatch, jj_bin: str
) -> None:
    monkeypatch.setenv("PATH", f"{Path(SYSTEM_GIT).parent}:{os.environ['PATH']}")
    lines = doctor_lines("app")
    assert lines["git (yours, on PATH)"].startswith("OK git version 2.39")
    assert lines["git yours reads app"].startswith("OK")
    assert lines["git jj's reads app"].startswith("OK")

    # a colocated workspace made by hand (as ralph-dev once did) breaks git 2.39 …
    env = {**os.environ, "JJ_USER": "Pat", "JJ_EMAIL": "pat@example.com",
           "PATH": f"{Path(person_gits(jj_bin)[1]).parent}:{os.environ['PATH']}"}

    def person_jj(*args: str) -> None:
        subprocess.run([jj_bin, "--no-pager", *args], cwd=project, env=env, check=True,
                       capture_output=True)

    person_jj("workspace", "add", "--colocate", "--name", "old", str(project.parent / "old"))
    line = doctor_lines("app")["git yours reads app"]
    assert line.startswith("FAIL") and "relativeworktrees" in line
    # … and the fix doctor names works once the workspace is forgotten
    person_jj("workspace", "forget", "old")
    fix = re.findall(r"`([^`]+)`", line)[-1]
    assert "config --unset extensions.relativeWorktrees" in fix
    subprocess.run(["/bin/sh", "-c", fix], check=True, capture_output=True)  # as typed
    assert doctor_lines("app")["git yours reads app"].startswith("OK")
