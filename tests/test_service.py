"""The systemd user unit: installable, pinned to this install, and valid."""

from __future__ import annotations

import os
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


def test_service_install_writes_a_pinned_valid_unit(xdg: Path, tmp_path: Path,
                                                    jj_bin: str) -> None:
    runner = CliRunner()
    repo = make_jj_repo(tmp_path / "repo")
    assert runner.invoke(main, ["init", "demo", "--repo", str(repo)]).exit_code == 0
    result = runner.invoke(main, ["service", "install", "demo", "--no-enable"])
    assert result.exit_code == 0, result.output
    unit = xdg / "config/systemd/user/ralph-dev@.service"
    text = unit.read_text()
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert exec_start.startswith(f"ExecStart={sys.executable} -P -m ralph_dev --config ")
    assert exec_start.endswith("start %i --foreground")
    assert "Restart=always" in text and "StartLimitBurst=5" in text
    # a hung daemon is restarted: systemd waits for READY=1 and watches the health loop
    assert "Type=notify" in text and "NotifyAccess=main" in text and "WatchdogSec=" in text
    # the PATH workers need, pinned: jj's git first, this ralph-dev, jj and Claude Code
    path = next(line for line in text.splitlines() if line.startswith("Environment=PATH="))
    entries = path.removeprefix("Environment=PATH=").split(":")
    assert entries[0] == str(Path(os.path.realpath(jj_bin)).parent)
    assert str(Path(sys.executable).parent) in entries
    claude = Path(os.environ["RALPH_DEV_CLAUDE_BIN"]).parent
    assert str(claude) in entries
    keys = xdg / "config/ralph-dev"
    assert f"EnvironmentFile=-{keys}/service.env" in text
    assert f"EnvironmentFile=-{keys}/%i.env" in text
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


@pytest.fixture
def demo(xdg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Project demo, and no systemd user manager reachable (as on this machine)."""
    repo = make_jj_repo(tmp_path / "repo")
    assert CliRunner().invoke(main, ["init", "demo", "--repo", str(repo)]).exit_code == 0
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    return xdg / "config/systemd/user/ralph-dev@.service"


def test_install_without_a_user_manager_leaves_nothing_behind(demo: Path) -> None:
    result = CliRunner().invoke(main, ["service", "install", "demo"])
    assert result.exit_code != 0
    assert "nothing was installed" in result.output and "enable-linger" in result.output
    assert not demo.exists()
    assert not list(demo.parent.glob("default.target.wants/*"))
    # an earlier unit (another project's) is put back as it was
    assert CliRunner().invoke(main, ["service", "install", "demo", "--no-enable"]).exit_code == 0
    before = demo.read_text()
    demo.write_text(before + "# the person's own note\n")
    assert CliRunner().invoke(main, ["service", "install", "demo"]).exit_code != 0
    assert demo.read_text() == before + "# the person's own note\n"


def test_install_refuses_while_the_project_runs_by_hand(demo: Path) -> None:
    from ralph_dev.adapters.processes import daemon_lock
    from ralph_dev.core.config import load_project

    with daemon_lock(load_project("demo").paths.daemon_pid):
        result = CliRunner().invoke(main, ["service", "install", "demo", "--no-enable"])
    assert result.exit_code != 0
    assert f"already running for demo (daemon pid {os.getpid()})" in result.output
    assert "ralph-dev stop demo" in result.output
    assert not demo.exists()


def test_key_files_must_be_private(demo: Path, xdg: Path) -> None:
    keys = xdg / "config/ralph-dev/demo.env"
    keys.write_text("ANTHROPIC_API_KEY=sk-ant-not-real\n")
    keys.chmod(0o644)
    result = CliRunner().invoke(main, ["service", "install", "demo", "--no-enable"])
    assert result.exit_code != 0 and f"chmod 600 {keys}" in result.output
    assert "sk-ant" not in result.output and not demo.exists()
    keys.chmod(0o600)
    result = CliRunner().invoke(main, ["service", "install", "demo", "--no-enable"])
    assert result.exit_code == 0 and f"Keys from: {keys}" in result.output


def test_uninstall_of_an_unknown_project_fails(demo: Path) -> None:
    result = CliRunner().invoke(main, ["service", "uninstall", "nope", "--no-disable"])
    assert result.exit_code != 0
    assert "no ralph-dev@nope.service is installed (installed: none)" in result.output
    assert "Removed" not in result.output


def test_service_install_all_installs_one_instance_per_project(demo: Path, tmp_path: Path,
                                                               xdg: Path) -> None:
    """Issue 36: the template unit, one instance per project, installed for all at once;
    a project that cannot be installed is said and the others are not held back."""
    second = make_jj_repo(tmp_path / "second")
    assert CliRunner().invoke(main, ["init", "second", "--repo", str(second)]).exit_code == 0
    keys = xdg / "config/ralph-dev/second.env"
    keys.write_text("ANTHROPIC_API_KEY=sk-ant-not-real\n")
    keys.chmod(0o644)  # second's keys are readable by others: second is refused
    result = CliRunner().invoke(main, ["service", "install", "--all", "--no-enable"])
    assert result.exit_code != 0
    assert f"second: not installed: {keys}" in result.output and "chmod 600" in result.output
    assert "1 of 2 projects were not installed (second)" in result.output
    assert "sk-ant" not in result.output
    assert demo.exists()  # demo's went in
    keys.chmod(0o600)
    result = CliRunner().invoke(main, ["service", "install", "--all", "--no-enable"])
    assert result.exit_code == 0, result.output
    assert result.output.count(f"Wrote {demo}") == 2
    neither = CliRunner().invoke(main, ["service", "install", "--no-enable"])
    assert neither.exit_code == 2 and "--all" in neither.output
    result = CliRunner().invoke(main, ["service", "uninstall", "--all", "--no-disable"])
    assert result.exit_code == 0, result.output
    assert "Removed ralph-dev@demo" in result.output and "Removed ralph-dev@second" in result.output
    assert not demo.exists()
