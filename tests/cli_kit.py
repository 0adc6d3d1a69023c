"""What the tests of the agent CLIs share: the pinned program, and a project whose
workers run it (``test_codex_smoke``, ``test_gemini_smoke``, ``test_egress``)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import make_jj_repo

from ralph_dev.core.agent_profiles import AgentProfile


def pinned_cli(profile: AgentProfile, found: str | None) -> str:
    """``found``, the CLI ``scripts/setup.sh`` installed, once it is the pinned version
    (``scripts/compat.sh`` runs the tests on others: ``RALPH_DEV_COMPAT``)."""
    if found is None:
        pytest.fail(f"{profile.title} is not installed: run scripts/setup.sh --test (it "
                    f"installs {profile.package}@{profile.pinned} into ~/.cache/ralph-dev/"
                    f"{profile.name}-{profile.pinned})")
    version = subprocess.run([found, *profile.version_args], capture_output=True, text=True,
                             check=False, timeout=60).stdout
    if not os.environ.get("RALPH_DEV_COMPAT"):
        assert profile.pinned in version, \
            f"{found} is {version!r}, not the pinned {profile.pinned}"
    return found


def cli_project(xdg: Path, tmux_socket: str, profile: AgentProfile, program: str,
                agent: tuple[str, ...] = ()) -> Path:
    """The config of project ``demo`` (a new jj repository, the local tracker) whose
    workers run ``profile``'s CLI, ``program``, with more ``agent`` keys: its path."""
    repo = make_jj_repo(xdg / "repo")
    config = xdg / "config" / "ralph-dev" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("\n".join([
        "[projects.demo]", f"repo = {json.dumps(str(repo))}", 'trunk = "main"',
        f"tmux_socket = {json.dumps(tmux_socket)}",
        f"verify_command = {json.dumps('test -f ok.txt')}",
        "[projects.demo.tracker]", 'key = "DEMO"',
        "[projects.demo.timing]", "poll_interval = 0.5",
        "[projects.demo.agent]", f"cli = {json.dumps(profile.name)}",
        f"{profile.bin_setting} = {json.dumps(program)}", 'home = "isolated"', *agent, ""]))
    return config
