"""``scripts/setup.sh`` keeps its promise: on a shell whose PATH has neither ralph-dev nor
jj, the line it prints makes both usable (doctor finds the Claude Code it installed by
itself: tests/test_doctor.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent


def test_setup_prints_a_path_line_that_makes_ralph_dev_and_jj_found(tmp_path: Path) -> None:
    bare = {"HOME": os.environ["HOME"], "PATH": "/usr/bin:/bin",
            "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME", f"{os.environ['HOME']}/.cache")}
    setup = subprocess.run(["bash", "scripts/setup.sh", "--test"], cwd=REPO, env=bare,
                           capture_output=True, text=True, timeout=900, check=False)
    assert setup.returncode == 0, setup.stderr
    line = setup.stdout.strip().splitlines()[-1]
    assert line.startswith('export PATH="') and "add this line" in setup.stderr
    # a new shell with that line: the README's commands work from any directory
    script = (f"{line}\ncd {tmp_path}\njj --version\nralph-dev --version\n"
              "XDG_CONFIG_HOME=$PWD/c ralph-dev doctor 2>&1 | grep '\\] jj' || true")
    shell = subprocess.run(["bash", "-c", script], env=bare, capture_output=True, text=True,
                           timeout=120, check=False)
    assert shell.returncode == 0, shell.stderr
    assert "jj 0." in shell.stdout and "ralph-dev, version" in shell.stdout
    assert "[OK  ] jj" in shell.stdout
