"""A worker's workspace never supplies ralph-dev's own code: every Python of
ralph-dev's that starts in a workspace (a pane's launcher, the egress proxy it starts
beside the sandbox) imports the installed ralph-dev, not a ``ralph_dev/`` the worker
left there. Seen on main: a workspace holding ``ralph_dev/__init__.py`` had it run by
the next pane started there, before the sandbox and with the launch's secrets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import retry_until

from ralph_dev.adapters.processes import launcher_argv
from ralph_dev.adapters.tmux import Tmux
from ralph_dev.agent.launch import launch_via_spec


def planted(workspace: Path, marker: Path) -> Path:
    """What a hostile worker leaves in its workspace: a package by ralph-dev's name whose
    import writes ``marker``."""
    package = workspace / "ralph_dev"
    (package / "inpane").mkdir(parents=True)
    code = f"open({str(marker)!r}, 'a').write('ran outside the sandbox\\n')\n"
    for module in ("__init__.py", "launcher.py", "inpane/__init__.py", "inpane/egress.py"):
        (package / module).write_text(code)
    return workspace


def test_a_pane_started_in_a_workspace_runs_the_installed_launcher(
        tmp_path: Path, tmux_socket: str) -> None:
    marker = tmp_path / "pwned"
    workspace = planted(tmp_path / "DEMO-1", marker)
    worker_dir = tmp_path / "worker"
    worker_dir.mkdir()
    launch = launch_via_spec([sys.executable, "-c", "print('the agent runs')"],
                             {"PATH": os.environ["PATH"], "API_KEY": "s3cret"}, workspace,
                             worker_dir / "launch.json")
    tmux = Tmux("ralph-test", tmux_socket)
    tmux.ensure_session(tmp_path, {"PATH": os.environ["PATH"]})
    log = tmp_path / "pane.log"
    tmux.open_window("DEMO-1", cwd=workspace, command=launch.argv, environment=launch.env,
                     log_file=log)
    retry_until(lambda: "the agent runs" in (log.read_text() if log.exists() else ""), 30,
                what="the agent's start in its pane")
    assert not marker.exists(), "the workspace's ralph_dev ran in the pane"
    assert not list(worker_dir.glob("*.secrets.json"))  # taken by the real launcher


def test_the_egress_proxy_a_launch_starts_in_its_workspace_is_the_installed_one(
        tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    workspace = planted(tmp_path / "DEMO-2", marker)
    spec = tmp_path / "launch.json"
    spec.write_text(json.dumps({
        "argv": [sys.executable, "-c", "print('the agent runs')"], "cwd": str(workspace),
        "env": {"PATH": os.environ["PATH"]}, "quiet": True,
        "egress": {"socket": str(tmp_path / "egress.sock"), "log": str(tmp_path / "ledger"),
                   "allow": []}}))
    done = subprocess.run(launcher_argv(str(spec)), cwd=workspace,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and "the agent runs" in done.stdout, done.stderr
    assert not marker.exists(), "the workspace's ralph_dev ran as the egress proxy"


@pytest.mark.parametrize("variable", ["PYTHONPATH", "PYTHONHOME"])
def test_a_panes_python_variables_never_choose_the_launchers_code(
        tmp_path: Path, variable: str) -> None:
    """A pane inherits the tmux server's environment, and the launcher runs before the
    spec replaces it: a ``PYTHONPATH`` naming a workspace made ``python -P -m`` import
    the ``ralph_dev`` there (a ``PYTHONHOME`` there, a Python that cannot start). The
    launcher runs isolated (``-I``): neither counts."""
    marker = tmp_path / "pwned"
    workspace = planted(tmp_path / "DEMO-3", marker)
    spec = tmp_path / "launch.json"
    spec.write_text(json.dumps({"argv": [sys.executable, "-c", "print('the agent runs')"],
                                "cwd": str(workspace), "env": {"PATH": os.environ["PATH"]},
                                "quiet": True}))
    done = subprocess.run(launcher_argv(str(spec)), cwd=workspace, capture_output=True,
                          text=True, timeout=60, check=False,
                          env={**os.environ, variable: str(workspace)})
    assert done.returncode == 0 and "the agent runs" in done.stdout, done.stderr
    assert not marker.exists(), f"{variable} chose the launcher's code"
