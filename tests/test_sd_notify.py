"""systemd's notify protocol, against a real unix datagram socket standing in for
systemd's ``NOTIFY_SOCKET``: the daemon says READY=1 once up, its health loop feeds the
watchdog, a hung (stopped) daemon stops feeding it, and it says STOPPING=1 on the way out.
(A real user manager runs the installed unit in tests/test_service_systemd.py.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from swarm_kit import Swarm

from ralph_dev.adapters.sd_notify import SystemdNotifier


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify.sock")
    sock.bind(path)
    yield sock, path
    sock.close()


def receive(sock: socket.socket, timeout: float) -> dict[str, str] | None:
    sock.settimeout(timeout)
    try:
        data = sock.recv(4096).decode()
    except TimeoutError:
        return None
    return dict(line.split("=", 1) for line in data.splitlines())


def test_messages_reach_the_socket(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    notifier = SystemdNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "600000000"})
    assert notifier.watchdog_s == 600
    # a health check due while a slow start is still under way: READY=1 comes first
    # (seen in CI: the first message was WATCHDOG=1)
    assert not notifier.alive() and receive(sock, 0.2) is None
    assert notifier.ready("up", watchdog_s=45)
    assert receive(sock, 1) == {"READY": "1", "STATUS": "up", "WATCHDOG_USEC": "45000000",
                                "WATCHDOG": "1"}
    assert notifier.alive() and receive(sock, 1) == {"WATCHDOG": "1"}
    assert notifier.stopping() and receive(sock, 1) == {"STOPPING": "1", "STATUS": "stopping"}


def test_abstract_socket_and_no_systemd(tmp_path: Path) -> None:
    name = f"ralph-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        assert SystemdNotifier({"NOTIFY_SOCKET": "@" + name}).send(READY=1)
        assert receive(sock, 1) == {"READY": "1"}
    assert not SystemdNotifier({}).ready("up")  # not under systemd: nothing, quietly
    assert not SystemdNotifier({}).alive()
    gone = SystemdNotifier({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})
    assert not gone.send(READY=1)  # a vanished manager is logged, never raised
    # a watchdog meant for another process (WATCHDOG_PID) is not ours to feed
    other = SystemdNotifier({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "1000", "WATCHDOG_PID": "1"})
    assert other.watchdog_s is None and not other.alive()


@pytest.mark.slow
def test_the_daemon_is_ready_feeds_the_watchdog_and_starves_it_when_hung(
    tmp_path: Path, jj_bin: str, tmux_socket: str,
    notify_socket: tuple[socket.socket, str],
) -> None:
    sock, path = notify_socket
    swarm = Swarm.create(tmp_path / "swarm", jj_bin, tmux_socket)  # health_interval = 1 s
    env = {**swarm.env, "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "600000000"}
    daemon = subprocess.Popen([sys.executable, "-m", "ralph_dev", "start", swarm.project,
                               "--foreground"], env=env, cwd=swarm.root,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ready = receive(sock, 30)
        assert ready and ready["READY"] == "1" and ready["WATCHDOG"] == "1", ready
        assert ready["WATCHDOG_USEC"] == "30000000"  # 3 health intervals, at least 30 s
        fed = [receive(sock, 3) for _ in range(2)]
        assert fed == [{"WATCHDOG": "1"}] * 2  # each health check feeds it
        os.kill(daemon.pid, signal.SIGSTOP)  # hung
        sock.settimeout(0.2)
        time.sleep(0.3)
        while receive(sock, 0.2):  # drain what was already in flight
            pass
        assert receive(sock, 3) is None  # no more food: systemd would restart it
        os.kill(daemon.pid, signal.SIGCONT)
        assert receive(sock, 5) == {"WATCHDOG": "1"}
        daemon.terminate()
        messages = [receive(sock, 10) for _ in range(3)]
        assert {"STOPPING": "1", "STATUS": "stopping"} in messages
        assert daemon.wait(30) == 0
    finally:
        if daemon.poll() is None:
            os.kill(daemon.pid, signal.SIGCONT)
            daemon.kill()
        swarm.teardown()
