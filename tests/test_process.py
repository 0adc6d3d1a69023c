"""The one command runner: what a caller gets back, what its error says, and that a
timeout leaves nothing running (real processes, no mocks)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import retry_until, running

from ralph_dev.adapters import jj_cli
from ralph_dev.adapters.jj_cli import JjCli, JJInterrupted
from ralph_dev.adapters.process import CommandFailed, run_command


def forking_script(path: Path, pids: Path) -> Path:
    """A command that starts a child of its own, says both pids, and waits forever."""
    path.write_text(f"#!/bin/sh\nsleep 600 &\necho $$ $! > {pids}\nwait\n")
    path.chmod(0o755)
    return path


def test_a_timeout_kills_the_command_and_what_it_started(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = forking_script(tmp_path / "hangs", pids)
    started = time.monotonic()
    result = run_command([str(script)], timeout=1.0)
    assert time.monotonic() - started < 1.0 + 4
    assert result.timed_out and result.interrupted and result.returncode == 124
    with pytest.raises(CommandFailed, match=r"hangs` failed \(timed out\).*did not answer"):
        result.check()
    for pid in map(int, pids.read_text().split()):
        retry_until(lambda pid=pid: not running(pid), timeout=5, what=f"process {pid} gone")


def test_the_error_names_the_command_its_words_and_code_but_no_secret() -> None:
    result = run_command(["sh", "-c", 'echo "no such thing" >&2; exit 3', "sh",
                          "-e", "API_KEY=sekret-1", "--setenv", "GH_TOKEN", "sekret-2",
                          "LINEAR_API_KEY=sekret-3", "PLAIN=shown"])
    assert not result.ok and result.returncode == 3
    with pytest.raises(CommandFailed) as info:
        result.check("install the thing")
    error = info.value
    assert error.returncode == 3 and "no such thing" in error.stderr
    text = f"{error} {' '.join(error.command)}"
    assert "no such thing" in text and "install the thing" in text and "PLAIN=shown" in text
    assert "sekret" not in text
    assert "API_KEY=<redacted>" in error.command and "GH_TOKEN" in error.command


def test_a_missing_binary_is_a_result_not_a_crash(tmp_path: Path) -> None:
    result = run_command([str(tmp_path / "nope")])
    assert result.returncode == 127 and "does not exist" in result.stderr
    with pytest.raises(CommandFailed, match="does not exist"):
        result.check()


def test_a_hung_jj_is_interrupted_not_refused(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """jj past its timeout (and the git it started) is killed; the error says the next
    try may work, which is what keeps the failure policy from charging the issue."""
    pids = tmp_path / "pids"
    fake = forking_script(tmp_path / "jj", pids)
    monkeypatch.setattr(jj_cli, "JJ_TIMEOUT", 1.0)
    result = JjCli(tmp_path, jj_bin=str(fake)).run("root")
    with pytest.raises(JJInterrupted, match="interrupted \\(timed out\\)") as info:
        result.check()
    assert info.value.retryable
    for pid in map(int, pids.read_text().split()):
        retry_until(lambda pid=pid: not running(pid), timeout=5, what=f"process {pid} gone")
