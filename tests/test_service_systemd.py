"""The installed unit under a real systemd user manager: ``service install`` returns once
the daemon said READY=1, the keys file and the pinned PATH reach it, a hung daemon is
killed by the watchdog and started again, and ``service uninstall`` stops it.

The machine has no systemd as PID 1, so a private ``systemd --user`` runs here in a
mount namespace of its own where ``/run/systemd/system`` exists (systemd refuses to
start a user manager without it); systemctl reaches it through the private socket in
``$XDG_RUNTIME_DIR/systemd``. Nothing outside that namespace and the test's directories
is touched. There is no journald in it, so the unit's output is not checked here.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from swarm_kit import Swarm, wait_for

pytestmark = pytest.mark.slow

MANAGER = """
mount -t tmpfs ralph-test /run/systemd && mkdir /run/systemd/system || exit 97
exec "$0" --user
"""


def systemctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemctl", "--user", *args], env=env, capture_output=True,
                          text=True, timeout=30, check=False)


def show(env: dict[str, str], unit: str, prop: str) -> str:
    return systemctl(env, "show", "--value", "-p", prop, unit).stdout.strip()


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    """The user manager's XDG_RUNTIME_DIR, short (its socket path has a length limit)."""
    runtime = Path(tempfile.mkdtemp(prefix="rd-sd-", dir="/tmp"))
    yield runtime
    shutil.rmtree(runtime, ignore_errors=True)


def start_user_manager(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A private ``systemd --user`` (see the module's docstring), answering on
    ``$XDG_RUNTIME_DIR/systemd/private``."""
    systemd = next((p for p in ("/lib/systemd/systemd", "/usr/lib/systemd/systemd")
                    if Path(p).exists()), None)
    if systemd is None or shutil.which("unshare") is None:
        pytest.fail("systemd and unshare are needed: apt install systemd util-linux")
    # root may make a mount namespace; anyone else needs a user namespace for it
    unprivileged = ["--user", "--map-root-user"] if os.geteuid() != 0 else []
    with log.open("wb") as out:
        manager = subprocess.Popen(
            ["unshare", *unprivileged, "--mount", "--propagation", "private",
             "sh", "-c", MANAGER, systemd],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def answers() -> bool:
        if manager.poll() is not None:
            pytest.fail(f"no user manager could start here (exit {manager.returncode}): "
                        + log.read_text(errors="replace")[-800:])
        return systemctl(env, "show", "-p", "Version").returncode == 0
    wait_for(answers, 30, "the private systemd user manager to answer")
    return manager


def test_the_unit_runs_under_a_real_user_manager(tmp_path: Path, jj_bin: str,
                                                 tmux_socket: str, runtime_dir: Path) -> None:
    swarm = Swarm.create(tmp_path / "swarm", jj_bin, tmux_socket)  # health_interval = 1 s
    swarm.env["XDG_RUNTIME_DIR"] = str(runtime_dir)
    swarm.env.pop("DBUS_SESSION_BUS_ADDRESS", None)
    env = swarm.env
    unit = f"ralph-dev@{swarm.project}.service"
    manager = None
    try:
        manager = start_user_manager(env, tmp_path / "manager.log")
        keys = Path(env["XDG_CONFIG_HOME"]) / "ralph-dev" / f"{swarm.project}.env"
        keys.write_text("ANTHROPIC_API_KEY=sk-ant-test-not-a-real-key\n")
        keys.chmod(0o600)
        installed = swarm.cli("service", "install", swarm.project)
        assert f"Enabled and started {unit}" in installed.stdout
        # Type=notify: `enable --now` returned only once the daemon said READY=1
        assert show(env, unit, "ActiveState") == "active"
        assert show(env, unit, "StatusText") == "watching the controller every 1s"
        pid = int(show(env, unit, "MainPID"))
        environ = dict(item.split("=", 1) for item in
                       Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
        assert environ["ANTHROPIC_API_KEY"] == "sk-ant-test-not-a-real-key"
        assert environ["PATH"].split(":")[0] == str(Path(os.path.realpath(jj_bin)).parent)
        assert "sk-ant" not in installed.stdout + installed.stderr
        status = swarm.status()
        assert status["daemon"] == {"running": True, "pid": pid}

        fed = show(env, unit, "WatchdogTimestampMonotonic")
        wait_for(lambda: show(env, unit, "WatchdogTimestampMonotonic") != fed, 10,
                 "the health loop to feed the watchdog", interval=0.5)
        os.kill(pid, signal.SIGSTOP)  # hung: the health loop stops feeding the watchdog

        def restarted() -> bool:
            now = show(env, unit, "MainPID")
            return (now not in ("", "0", str(pid)) and
                    show(env, unit, "ActiveState") == "active")
        # watchdog 30 s (3 health intervals, at least 30 s) + RestartSec 10 s + a start
        wait_for(restarted, 150, "systemd to kill the hung daemon and start a new one",
                 interval=1)
        assert int(show(env, unit, "NRestarts")) >= 1
        assert not Path(f"/proc/{pid}").exists()
        new_pid = int(show(env, unit, "MainPID"))

        swarm.cli("service", "uninstall", swarm.project)
        wait_for(lambda: not Path(f"/proc/{new_pid}").exists(), 60, "the daemon to stop")
        assert show(env, unit, "LoadState") == "not-found"
        assert not (Path(env["XDG_CONFIG_HOME"]) / "systemd/user/ralph-dev@.service").exists()
    finally:
        if manager is not None:
            manager.terminate()  # stops what it runs, then exits
            try:
                manager.wait(30)
            except subprocess.TimeoutExpired:
                manager.kill()
        swarm.teardown()
