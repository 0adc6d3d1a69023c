"""The daemon's health loop: restarts a dead controller, backs off from a crash
loop (saying so once), and then hands the swarm to the supervisor agent."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import make_jj_repo, retry_until

from ralph_dev.adapters.store import StateStore
from ralph_dev.adapters.tmux import Tmux
from ralph_dev.cli import main
from ralph_dev.control import daemon as daemon_mod
from ralph_dev.control.daemon import Daemon
from ralph_dev.core.config import load_project
from ralph_dev.devtools.scripted_model import FakeAnthropic, Text, conversation_text

pytestmark = pytest.mark.slow

DIAGNOSIS = "Diagnosis: the controller exits at once; check its log."


def test_crash_loop_backs_off_once_and_starts_the_supervisor(
    xdg: Path, tmp_path: Path, tmux_socket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from claude_env import find_claude

    repo = make_jj_repo(tmp_path / "repo")
    assert CliRunner().invoke(main, ["init", "demo", "--repo", str(repo)]).exit_code == 0
    config = xdg / "config/ralph-dev/config.toml"
    config.write_text(config.read_text() + (
        "[projects.demo.timing]\ncrash_loop_restarts = 2\n"
        f'[projects.demo.agent]\nsupervisor = true\nhome = "isolated"\n'
        f'claude_bin = "{find_claude()}"\n'
    ))
    monkeypatch.setenv("RALPH_DEV_TMUX_SOCKET", tmux_socket)
    # a controller that dies at once, every time
    monkeypatch.setattr(daemon_mod, "ralph_command", lambda *args: ["false"])
    seen: list[str] = []

    def brain(request: dict) -> list:
        seen.append(conversation_text(request))
        return [Text(DIAGNOSIS)]

    with FakeAnthropic(brain) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-0000000000000000000000")
        settings = load_project("demo")
        tmux = Tmux.from_settings(settings)
        tmux.ensure_session(repo, {"PATH": "/usr/bin:/bin"})
        store = StateStore(settings.paths)
        daemon = Daemon(settings, tmux=tmux, store=store)

        def dead() -> bool:
            return not daemon.controller_health()[0]

        daemon.start_controller("test start")
        for _ in range(3):  # restart, then crash loop (announce + supervisor), then quiet
            retry_until(dead, 10, what="the controller to die")
            asyncio.run(daemon.health_check())
        kinds = [e["event"] for e in store.iter_events()]
        assert kinds.count("controller_start") == 2  # no restarts past the crash-loop limit
        assert kinds.count("controller_crash_loop") == 1  # said once
        assert kinds.count("supervisor_started") == 1
        log = settings.paths.logs_dir / "supervisor.log"
        retry_until(lambda: log.exists() and DIAGNOSIS in log.read_text(), 60,
                    what="the supervisor's answer in its log")
        assert any("ralph-dev-supervisor" in text or "supervisor" in text for text in seen)
        assert any("controller" in text and "demo" in text for text in seen)  # the snapshot
