"""The systemd user unit: installable, pinned to this install, and valid."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import make_jj_repo

from ralph_dev.cli import main

REPO = Path(__file__).resolve().parent.parent


def verify_unit(directory: Path) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.fail("systemd-analyze is missing: install systemd (apt install systemd)")
    return subprocess.run([tool, "verify", str(directory / "ralph-dev@demo.service")],
                          capture_output=True, text=True, check=False)


def test_repo_template_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    shutil.copy(REPO / "systemd" / "ralph-dev@.service", tmp_path)
    result = verify_unit(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ""  # unknown keys only warn: any output is a defect


def test_verify_really_catches_a_broken_unit(tmp_path: Path) -> None:
    text = (REPO / "systemd" / "ralph-dev@.service").read_text()
    (tmp_path / "ralph-dev@.service").write_text(text.replace("Restart=always", "Restart=often"))
    assert "restart specifier" in verify_unit(tmp_path).stderr


def test_service_install_writes_a_pinned_valid_unit(xdg: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    repo = make_jj_repo(tmp_path / "repo")
    assert runner.invoke(main, ["init", "demo", "--repo", str(repo)]).exit_code == 0
    result = runner.invoke(main, ["service", "install", "demo", "--no-enable"])
    assert result.exit_code == 0, result.output
    unit = xdg / "config/systemd/user/ralph-dev@.service"
    text = unit.read_text()
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert exec_start.startswith(f"ExecStart={sys.executable} -m ralph_dev --config ")
    assert exec_start.endswith("start %i --foreground")
    assert "Restart=always" in text and "StartLimitBurst=5" in text
    verdict = verify_unit(unit.parent)
    assert verdict.returncode == 0 and verdict.stderr.strip() == "", verdict.stderr

    result = runner.invoke(main, ["service", "uninstall", "demo", "--no-disable"])
    assert result.exit_code == 0, result.output
    assert not unit.exists()


def test_service_install_refuses_unknown_project(xdg: Path) -> None:
    result = CliRunner().invoke(main, ["service", "install", "nope", "--no-enable"])
    assert result.exit_code != 0
    assert "unknown project 'nope'" in result.output
    assert not (xdg / "config/systemd/user/ralph-dev@.service").exists()
