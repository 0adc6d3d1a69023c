"""The README's main command: `ralph-dev demo` runs a swarm to the end and
leaves nothing running, with the scripted agent and with real Claude Code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("agent", ["--scripted", "--claude"])
def test_demo_runs_to_completion_and_leaves_nothing_running(
    agent: str, xdg, jj_bin: str
) -> None:
    env = {**os.environ, "RALPH_DEV_JJ": jj_bin}
    if agent == "--claude":
        from claude_env import find_claude

        env["RALPH_DEV_CLAUDE_BIN"] = find_claude()
    proc = subprocess.run([sys.executable, "-m", "ralph_dev", "demo", agent, "--timeout", "300"],
                          env=env, capture_output=True, text=True, timeout=420,
                          stdin=subprocess.DEVNULL, check=False)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "ralph-dev DEMO" in out  # clearly labeled
    assert "Demo finished: every issue is Done." in out
    assert ("real Claude Code" in out) is (agent == "--claude")
    trunk = out.split("Trunk (main) now holds:")[1].split("project demo")[0]
    assert len(re.findall(r"KV-\d+: ", trunk)) == 10  # every task's change, once
    socket = re.search(r"tmux -L (\S+) attach", out).group(1)
    alive = subprocess.run(["tmux", "-L", socket, "list-sessions"], capture_output=True)
    assert alive.returncode != 0  # its tmux server is gone
    where = re.search(r"everything lives in (\S+)", out).group(1)
    assert not Path(where).exists()  # throwaway files removed (no --keep)
    # it never touched the person's own ralph-dev instance
    assert not (xdg / "config" / "ralph-dev").exists()
