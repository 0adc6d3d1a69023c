"""The daemon's health loop: restarts a dead controller, backs off from a crash
loop (saying so once), and then hands the swarm to the supervisor agent."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import signal
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import make_jj_repo, retry_until
from swarm_kit import Swarm, wait_for

from ralph_dev.adapters.store import StateStore
from ralph_dev.adapters.tmux import Tmux
from ralph_dev.cli import main
from ralph_dev.control.daemon import daemon as daemon_mod
from ralph_dev.control.daemon.daemon import Daemon
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
    config.write_text(config.read_text().replace("[projects.demo.agent]\n", (
        f'[projects.demo.agent]\nsupervisor = true\nhome = "isolated"\n'
        f'claude_bin = "{find_claude()}"\n'), 1) + "[projects.demo.timing]\n"
        "crash_loop_restarts = 2\n")
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


class Frozen:
    """A process stopped as a hung one is: it runs no code and leaves every signal but
    SIGKILL pending. (A SIGSTOP will not do: tmux continues a stopped pane at once.) The
    test holds it in a ptrace stop, which its parent never hears of."""

    SEIZE, INTERRUPT, DETACH = 0x4206, 0x4207, 17

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
                                     ctypes.c_void_p]
        # every thread: a running one would take the signal for the stopped main thread.
        # A thread not yet held may start another meanwhile (the controller's thread
        # pools grow), so list again until every thread listed is held.
        self.threads: list[int] = []
        while fresh := [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()
                        if int(t.name) not in self.threads]:
            for tid in fresh:
                for request in (self.SEIZE, self.INTERRUPT):
                    if self.libc.ptrace(request, tid, None, None) != 0:
                        assert ctypes.get_errno() == errno.ESRCH, ctypes.get_errno()
                        break  # it ended before it was held
                self.threads.append(tid)

    def pending(self, signum: int) -> bool:
        """True once ``signum`` was sent to it (and, frozen, it left it waiting)."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return False
        masks = [int(line.split()[1], 16) for line in status.splitlines()
                 if line.startswith(("SigPnd:", "ShdPnd:"))]
        return any(mask & (1 << (signum - 1)) for mask in masks)

    def release(self) -> None:
        """Let go (a tracee the tracer leaves is detached by the kernel) and reap it."""
        for tid in self.threads:
            self.libc.ptrace(self.DETACH, tid, None, None)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(tid, os.WNOHANG | 0x40000000)  # __WALL


def live_controller(swarm: Swarm) -> int | None:
    """The pid of the controller in the controller window, once it ticks (one the
    daemon already replaced is ending, and would not be the one restarted)."""
    panes = swarm.tmux("list-panes", "-a", "-F", "#{window_name} #{pane_pid}").stdout
    pids = [int(pid) for name, pid in (line.split() for line in panes.splitlines())
            if name == "controller"]
    beat = swarm.heartbeat().get("pid")
    return beat if pids == [beat] else None


def test_a_stop_while_the_health_check_restarts_a_frozen_controller_is_clean(
        tmp_path: Path, jj_bin: str, tmux_socket: str) -> None:
    """Issue 25: `ralph-dev stop` lands while the health check is restarting a frozen
    controller (waiting for it to end). The daemon stops cleanly: no traceback in its
    logs, and no controller started after the stop."""
    # a stale heartbeat of 6 s: a controller slow to start on a loaded host is not
    # restarted before the test can freeze it
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket,
                         timing={"heartbeat_stale": 6, "health_interval": 0.5})
    frozen: Frozen | None = None
    try:
        swarm.start()
        swarm.wait_first_tick()
        daemon = swarm.daemon_pid()
        frozen = Frozen(wait_for(lambda: live_controller(swarm), 30, "the live controller"))
        wait_for(lambda: frozen.pending(signal.SIGTERM), 90,
                 "the health check asking the frozen controller to stop (its restart)")
        stopped = swarm.cli("stop", swarm.project)
        assert f"stopped daemon pid {daemon}" in stopped.stdout
        wait_for(lambda: not Path(f"/proc/{daemon}").exists(), 30, "the daemon's exit")
        time.sleep(1)  # a restart that outlived the stop would have opened its window now
        assert "controller" not in swarm.windows()
        logs = {name: (swarm.state_dir / "logs" / name).read_text()
                for name in ("daemon.log", "daemon.jsonl")}
        for name, text in logs.items():
            assert "Traceback" not in text and "CancelledError" not in text, f"{name}:\n{text}"
        kinds = [e["event"] for e in swarm.events()]
        assert kinds[-1] == "daemon_stopped", kinds[-5:]
        assert "health_check_failed" not in kinds
    finally:
        if frozen is not None:
            frozen.release()
        swarm.teardown()


def test_a_cluster_projects_controller_is_looked_at_within_a_quarter_of_its_lease(
        xdg: Path) -> None:
    """Issue 37: a controller that died must be restarted and calling before its
    workers' hosts stop their agents (¾ of the lease without a call). With the default
    health interval (180 s) and a 30 s lease, every cluster agent stopped after a crash."""
    from test_config import write_config

    from ralph_dev.control.daemon.daemon import health_interval

    write_config('[projects.app]\nrepo = "/r"\n')
    assert health_interval(load_project("app", environ={})) == 180.0
    write_config('[projects.app]\nrepo = "/r"\n[projects.app.cluster]\nlease = 30\n')
    assert health_interval(load_project("app", environ={})) == 7.5
    write_config('[projects.app]\nrepo = "/r"\n[projects.app.timing]\nhealth_interval = 2\n'
                 '[projects.app.cluster]\nlease = 30\n')
    assert health_interval(load_project("app", environ={})) == 2.0
